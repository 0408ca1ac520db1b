"""A tiny randomly initialised Llama target for pure-mechanism tests (not a stand-in for results)."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle.models.head import new_head
from eagle.models.target import Target


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


def tiny_features(target: Target, out, n_train: int = 12, n_heldout: int = 4, length: int = 20,
                  seed: int = 0) -> None:
    """A finished EAGLE-3 feature directory for `target` (what `prepare --head-type eagle3` leaves: shards with
    the three layers' inputs and the last feature, token counts, a manifest with its stats), made from
    random token sequences whose second half is the assistant's (prepare needs a chat template the tiny
    tokenizer lacks). The target needs at least 3 layers."""
    from pathlib import Path

    from eagle.models.headio import COUNTS_FILE
    from eagle.models.layouts import eagle3_feature_layers
    from eagle.training.features import _save_tensors, _write_shard, count_tokens, samples_sha256
    from eagle.records.files import atomic_write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gen, vocab = torch.Generator().manual_seed(seed), target.config.vocab_size
    mask = torch.arange(length) >= length // 2
    samples = {split: [(torch.randint(1, vocab, (length,), generator=gen), mask) for _ in range(n)]
               for split, n in (("heldout", n_heldout), ("train", n_train))}
    layers = list(eagle3_feature_layers(target.config.num_hidden_layers))
    for split, chunk in samples.items():
        _write_shard(target, chunk, out / f"{split}-00000.safetensors", layers)
    _save_tensors({"token_counts": count_tokens(samples["train"], vocab)}, out / COUNTS_FILE)
    atomic_write_json(out / "manifest.json", {"model": target.name, "head_type": "eagle3", "feature_layers": layers,
                                              "samples_sha256": samples_sha256(samples),
                                              "stats": {"train_samples": n_train, "heldout_samples": n_heldout}})


# The architecture matrix (tests/test_architectures.py, README "Architectures"): each family as a tiny
# random fp32 model; a window that a 6-token prompt plus a short reply runs past.
WINDOW = 5


def family_config(family: str, vocab: int = 16):
    """A tiny config of `family` (see FAMILIES); "-window" variants slide every or some layers."""
    import transformers as tf
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=None, pad_token_id=None, bos_token_id=None, tie_word_embeddings=True)
    make = {
        "llama": lambda: tf.LlamaConfig(**common),
        "qwen2": lambda: tf.Qwen2Config(**common),
        "qwen2-window": lambda: tf.Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW,
                                               max_window_layers=1),  # layers 1, 2 slide, as Qwen2 counts
        "qwen3": lambda: tf.Qwen3Config(**common, head_dim=8),
        "mistral": lambda: tf.MistralConfig(**common, sliding_window=None),
        "mistral-window": lambda: tf.MistralConfig(**common, sliding_window=WINDOW),
        "phi3": lambda: tf.Phi3Config(**common, sliding_window=None),
        "phi3-window": lambda: tf.Phi3Config(**common, sliding_window=WINDOW),
        "gemma2-window": lambda: tf.Gemma2Config(**common, head_dim=8, sliding_window=WINDOW,
                                                 query_pre_attn_scalar=8),
        "gemma3-window": lambda: tf.Gemma3TextConfig(**common, head_dim=8, sliding_window=WINDOW,
                                                     query_pre_attn_scalar=8, sliding_window_pattern=2),
    }
    return make[family]()


FAMILIES = ("llama", "qwen2", "qwen2-window", "qwen3", "mistral", "mistral-window", "phi3", "phi3-window",
            "gemma2-window", "gemma3-window")


def family_target(family: str, seed: int = 0, vocab: int = 16) -> Target:
    """A tiny random target of `family`, with the attention load_target would pick for it."""
    from transformers import AutoModelForCausalLM
    from eagle.models.loader import attention_for
    config = family_config(family, vocab)
    config._attn_implementation = attention_for(config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation)
    model.eval().requires_grad_(False)
    tok = ByteTokenizer()
    tok.eos_token_id, tok.vocab_size = None, vocab
    return Target(model=model, tokenizer=tok, name=f"tiny-{family}")


def fixed_auto_report(chosen: dict, costs, curve: list[dict] | None = None, **figures):
    """An AutoReport for a test that fixes the auto budget: the given budget, costs and figures, and
    neutral others (no replayed grid: choice_at_context is not for it)."""
    from eagle.tools.budget.replay import AcceptModel
    from eagle.tools.budget.report import AutoReport
    curve = curve if curve is not None else [dict(chosen, accept_length=1.5, round_s=costs.round_cost(
        chosen["total_tokens"], chosen["depth"], chosen["top_k"], chosen["draft_vocab"]), tokens_per_s=1.0, speedup=1.0)]
    grid = AcceptModel.from_json({"ns": [1], "depths": [0], "top_ks": [1], "vocabs": [0], "grid": {"1/0": [[1.0]]}})
    values = dict(chosen=chosen, curve=curve, top=curve[:5], best_per_vocab=curve[:1], by_context=[],
                  expected_tokens_per_s=1.0, expected_accept_length=1.5, lookup_tokens=0, expected_lookup_nodes=0.0,
                  expected_speedup=1.0,
                  expected_speedup_same_dtype=1.0, beats_vanilla=False, vanilla_tokens_per_s=1.0,
                  vanilla_same_dtype_tokens_per_s=1.0, vanilla_dtype="float32", same_dtype_factor=1.0,
                  t_plain=costs.t_plain(), t_verify={str(n): t for n, t in costs.verify.items()}, alpha=1.0,
                  host_ms={"tree": 1000 * costs.host_tree, "plain": 1000 * costs.host_plain}, calibration_rounds=1,
                  calibration_accept_length=1.5, costs=costs, accept_table=grid, costs_file="", auto_file="")
    return AutoReport(**{**values, **figures})


def context_auto_report():
    """An AutoReport with a replayed grid whose best tree depends on the context length: at auto's
    reference (its probe's prefix) verifying is dear and 2/1/2/0 wins; over a short context verify is
    cheap and 8/2/2/0 wins. Both beat plain decoding (no fallback to vanilla)."""
    from eagle.tools.budget.costs import Costs
    from eagle.tools.budget.replay import AcceptModel
    steep, flat = {1: 0.010, 2: 0.011, 4: 0.016, 8: 0.040}, {1: 0.010, 2: 0.010, 4: 0.010, 8: 0.011}
    costs = Costs("k", steep, {"2/0": (0.001, 0.001)}, 0.001, verify_by_context={16: flat, 192: steep},
                  prefill={32: 0.02, 192: 0.1})
    grid = AcceptModel.from_json({"ns": [1, 2, 4, 8], "depths": [1, 2], "top_ks": [2], "vocabs": [0],
                                  "grid": {"2/0": [[1.0, 1.5, 1.8, 1.9], [1.0, 1.5, 2.0, 2.6]]}})
    chosen = dict(total_tokens=2, depth=1, top_k=2, draft_vocab=0)
    return fixed_auto_report(chosen, costs, accept_table=grid, expected_accept_length=1.5, expected_speedup=1.07,
                             expected_speedup_same_dtype=1.07)
