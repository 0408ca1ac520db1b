"""A tiny randomly initialised Llama target for pure-mechanism tests (not a stand-in for results)."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle.head import new_head
from eagle.target import Target


class ByteTokenizer:
    """Enough of a tokenizer for the decoder: ids print as '<i>'; eos_token_id None means no EOS."""
    eos_token_id = 0
    chat_template = None
    vocab_size = 12

    def encode(self, text: str) -> list[int]:
        """Each byte as an id in [1, vocab): prompts for the tools that take text (not a real tokenizer)."""
        return [1 + b % (self.vocab_size - 1) for b in text.encode()]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)


def tiny_target(vocab: int = 12, seed: int = 0, eos: int | None = 0, layers: int = 2) -> Target:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=eos, pad_token_id=None, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    tok = ByteTokenizer()
    tok.eos_token_id, tok.vocab_size = eos, vocab
    return Target(model=model, tokenizer=tok, name="tiny-llama")


def tiny_pair(vocab: int = 12, seed: int = 0, eos: int | None = 0):
    target = tiny_target(vocab, seed, eos)
    return target, new_head(target, seed=seed + 1)
