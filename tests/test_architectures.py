"""The architecture matrix (README "Architectures"): every family decodes losslessly on a tiny random fp32
model, sliding windows included, or is refused before its weights load in one sentence."""
import pytest
import torch

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.models.head import new_head
from eagle.models.loader import load_target
from eagle.models.location import ModelLoadError
from eagle.core.tree import build_tree
from tests.tiny import FAMILIES, WINDOW, family_config, family_target

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]  # longer than WINDOW: every sliding layer already cuts the prefix


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_verify_equals_hf_on_every_path(family, single_thread):
    """One tree verify past the window gives, at every node, the logits transformers computes for the
    prefix plus that node's path: the tree mask, the window and the cache agree with HF's."""
    tgt = family_target(family)
    tokens, parents = torch.tensor([7, 2, 11, 5, 8, 13]), torch.tensor([-1, 0, 0, 1, 3, 2])
    tree = build_tree(tokens, parents)
    cache, n = tgt.new_cache(32), len(PROMPT)
    tgt.forward(torch.tensor([PROMPT]), torch.arange(n)[None], cache, 0)
    cache.length = n
    got, _ = tgt.forward(tokens[None], (n + tree.depths)[None], cache, n, tree.mask)
    for node in range(len(tokens)):
        path, i = [], node
        while i >= 0:
            path.insert(0, int(tokens[i]))
            i = int(parents[i])
        ref = tgt.model(torch.tensor([PROMPT + path])).logits[0, -1]
        assert torch.allclose(got[0, node], ref, atol=1e-5), (family, node)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_hf_generate_and_eagle_equals_vanilla(family, single_thread):
    """fp32 greedy: vanilla equals HF generate token for token, and EAGLE-2 dynamic trees (a random head,
    so rounds both accept and reject) equal vanilla, over a reply that runs far past the window."""
    tgt = family_target(family)
    new = 4 * WINDOW
    vanilla = generate(Decoder(tgt, None, DecodeConfig(mode="vanilla", max_new_tokens=new)), PROMPT)
    ref = tgt.model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                             attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long), pad_token_id=0)
    assert vanilla.tokens == ref[0, len(PROMPT):].tolist()
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=new, total_tokens=8, depth=3, top_k=3)
    dynamic = generate(Decoder(tgt, new_head(tgt, seed=1), cfg), PROMPT)
    assert dynamic.tokens == vanilla.tokens
    assert any(s.accept_length > 0 for s in dynamic.steps)  # some tree path was accepted past the window


def test_softcapped_logits_are_the_models_own(single_thread):
    """Gemma2 softcaps its final logits (and attention scores, hence eager attention): the target's
    logits are the model's, not the raw lm_head's."""
    tgt = family_target("gemma2-window")
    assert tgt.config._attn_implementation == "eager" and tgt.config.final_logit_softcapping
    tgt.config.final_logit_softcapping = 0.1  # random logits are small: a cap of 30 would not bend them
    cache = tgt.new_cache(16)
    logits, feats = tgt.forward(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], cache, 0)
    ref = tgt.model(torch.tensor([PROMPT])).logits
    assert torch.allclose(logits, ref, atol=1e-5)
    assert not torch.allclose(tgt.model.lm_head(feats), ref, atol=1e-3)


def _model_dir(tmp_path, config, weights: bool):
    """A local model directory: config.json, a word-level tokenizer and, if asked, random weights."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    vocab = {f"t{i}": i for i in range(config.get_text_config().vocab_size)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")), unk_token="t0")
    tok.save_pretrained(tmp_path)
    if weights:
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    else:
        config.save_pretrained(tmp_path)
    return str(tmp_path)


def test_gemma2_loads_with_eager_attention(tmp_path, single_thread):
    """load_target picks eager attention for Gemma2 itself (no flag could) and decodes like HF."""
    tgt = load_target(_model_dir(tmp_path, family_config("gemma2-window"), weights=True), dtype="float32")
    assert tgt.config._attn_implementation == "eager"
    out = generate(Decoder(tgt, None, DecodeConfig(mode="vanilla", max_new_tokens=12)), PROMPT)
    ref = tgt.model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=12, min_new_tokens=12,
                             attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long), pad_token_id=0)
    assert out.tokens == ref[0, len(PROMPT):].tolist()


def _multimodal_gemma3():
    import transformers as tf
    return tf.Gemma3Config(text_config=family_config("gemma3-window").to_dict())


def _bidirectional_gemma3():
    config = family_config("gemma3-window")
    config.use_bidirectional_attention = True
    return config


@pytest.mark.parametrize("make, message", [
    (_bidirectional_gemma3, "use_bidirectional_attention set: it is an encoder"),
    (_multimodal_gemma3, "is a multimodal checkpoint"),
])
def test_unsupported_checkpoints_are_refused_before_loading(tmp_path, make, message):
    """A directory with no weights at all: the one-sentence refusal must come from the config alone."""
    with pytest.raises(ModelLoadError, match=message):
        load_target(_model_dir(tmp_path, make(), weights=False), dtype="float32")
