"""Foundation: loading the embedded default model, the lean forward path, the KV cache, vanilla decoding."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eagle import cli
from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.core.prompt import encode_prompt
from eagle.models.loader import load_target
from eagle.models.location import DEFAULT_MODEL, ModelLoadError, cache_dir
from tests.tiny import tiny_target

ROOT = Path(__file__).resolve().parent.parent


def test_default_model_loads_from_cache_quickly(target):
    assert (cache_dir() / DEFAULT_MODEL / "model.safetensors").is_file()
    t0 = time.perf_counter()
    again = load_target()
    assert time.perf_counter() - t0 < 5.0
    assert again.config.vocab_size == 49152 and again.dtype == torch.float32
    assert again.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_missing_model_gives_one_clear_sentence(tmp_path):
    with pytest.raises(ModelLoadError, match="No model directory at"):
        load_target(str(tmp_path / "no-such-model"))


def test_forward_features_are_post_norm_hidden_states(target):
    ids = torch.tensor([[1, 504, 3458, 314, 260, 2365]])
    cache = target.new_cache(16)
    logits, feats = target.forward(ids, torch.arange(6)[None], cache, 0)
    ref = target.model(ids, output_hidden_states=True)
    assert torch.allclose(logits, ref.logits, atol=1e-4)
    # transformers applies the final norm to the last hidden state it returns: that is the EAGLE feature.
    assert torch.allclose(feats, ref.hidden_states[-1], atol=1e-4)
    assert torch.allclose(target.lm_head(feats), logits, atol=1e-4)


@pytest.mark.parametrize("accepted", [[0, 2, 3], [0, 1], [0]])  # moved; already in place (nothing moves)
def test_cache_commit_equals_recomputing_the_accepted_prefix(single_thread, accepted: list[int]):
    tgt = tiny_target()
    prefix, tree_tokens = torch.tensor([[3, 5, 7]]), torch.tensor([[2, 4, 6, 8]])
    parents = [-1, 0, 0, 2]  # node 3 hangs under node 2; nodes 1 and 3 are on different branches
    from eagle.core.tree import build_tree
    tree = build_tree(tree_tokens[0], torch.tensor(parents))
    cache = tgt.new_cache(32)
    tgt.forward(prefix, torch.arange(3)[None], cache, 0)
    cache.length = 3
    tgt.forward(tree_tokens, (3 + tree.depths)[None], cache, 3, tree.mask)
    cache.commit([3 + i for i in accepted])
    n = 3 + len(accepted)
    got, _ = tgt.forward(torch.tensor([[9]]), torch.tensor([[n]]), cache, n)
    full = torch.tensor([[3, 5, 7, *tree_tokens[0, accepted].tolist(), 9]])
    ref, _ = tgt.forward(full, torch.arange(n + 1)[None], tgt.new_cache(32), 0)
    assert cache.length == n
    assert torch.allclose(got[0, -1], ref[0, -1], atol=1e-5)


def test_cache_overflow_is_a_clear_error(single_thread):
    tgt = tiny_target()
    with pytest.raises(ValueError, match="KV cache overflow"):
        tgt.forward(torch.tensor([[1, 2, 3]]), torch.arange(3)[None], tgt.new_cache(2), 0)


@pytest.mark.slow
def test_vanilla_greedy_equals_hf_generate(target):
    ids = encode_prompt(target.tokenizer, "Give me two tips for better sleep.", target.max_context)
    ours = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=48)), ids)
    ref = target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=48,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert ours.tokens == ref[0, len(ids):].tolist()
    assert len(ours.steps) == len(ours.tokens)  # one record per token


def test_vanilla_sampling_is_seeded_and_respects_eos(target):
    ids = encode_prompt(target.tokenizer, "Say hello.", target.max_context)
    cfg = DecodeConfig(mode="vanilla", max_new_tokens=24, temperature=0.8, top_p=0.9, top_k_sampling=50, seed=3)
    a = generate(Decoder(target, None, cfg), ids)
    b = generate(Decoder(target, None, cfg), ids)
    assert a.tokens == b.tokens
    assert a.finished in ("eos", "max_new_tokens")
    assert a.finished != "eos" or a.tokens[-1] in target.eos_ids


def test_chat_template_is_applied(target):
    ids = encode_prompt(target.tokenizer, "Hi", target.max_context)
    text = target.tokenizer.decode(ids)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_cli_generate_json_summary():
    out = _cli("generate", "--prompt", "What is 2+2?", "--mode", "vanilla", "--max-new-tokens", "8", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("text", "new_tokens", "seconds", "tokens_per_second", "mode", "tau", "target_forwards"):
        assert key in summary
    assert summary["mode"] == "vanilla" and 1 <= summary["new_tokens"] <= 8


@pytest.mark.parametrize("args, message", [
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "hi", "--depth", "-1"], "depth must be"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature must be"),
    (["--prompt", "hi", "--head", "/no/such/head"], "No draft head"),
])
def test_cli_bad_input_is_one_clear_sentence(args, message, capsys):
    # In-process (test_cli_generate_json_summary runs `python -m eagle` itself): the same main and error boundary.
    assert cli.main(["generate", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_auto_dtype_picks_the_faster_measured_and_caches_it(tmp_path, monkeypatch, single_thread):
    """--dtype auto on a CPU: the dtype with the least t(1) + t(8) wins; the second call reads the
    cache instead of timing again, and `refresh` times anew."""
    from eagle.models import precision as precision_mod
    from tests.tiny import tiny_target
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    tiny = tiny_target()
    first = precision_mod.choose_cpu_dtype(tiny)
    ms = first["ms"]
    assert set(ms) == {"float32", "bfloat16"} and all(set(v) == {"1", "8"} for v in ms.values())
    assert first["chosen"] == min(ms, key=lambda d: sum(ms[d].values())) and first["chosen"] in first["reason"]
    assert tiny.dtype == torch.float32  # measured on copies
    calls = []
    monkeypatch.setattr(precision_mod, "measure_dtypes", lambda t: calls.append(t) or {
        "float32": {1: 2.0, 8: 2.0}, "bfloat16": {1: 1.0, 8: 1.0}})
    assert precision_mod.choose_cpu_dtype(tiny)["ms"] == ms and not calls
    assert precision_mod.choose_cpu_dtype(tiny, refresh=True)["chosen"] == "bfloat16" and len(calls) == 1


def test_auto_dtype_for_plain_decoding_is_the_faster_single_token(tmp_path, monkeypatch):
    """A CPU whose bf16 reads weights faster but computes a tree slower (AVX2 without bf16 units, 2026-12-06:
    t(1) 39 vs 59 ms, t(8) 149 vs 119 ms): trees verify in fp32, plain decoding runs bf16, from one timing."""
    from eagle.models import precision as precision_mod
    from tests.tiny import tiny_target
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(precision_mod, "measure_dtypes", lambda t: calls.append(t) or {
        "float32": {1: 0.059, 8: 0.119}, "bfloat16": {1: 0.039, 8: 0.149}})
    tiny = tiny_target()
    trees, plain = precision_mod.choose_cpu_dtype(tiny), precision_mod.choose_cpu_dtype(tiny, plain=True)
    assert trees["chosen"] == "float32" and plain["chosen"] == "bfloat16" and len(calls) == 1
    assert "one token at a time" in plain["reason"] and "t(1) 39 ms" in plain["reason"]


@pytest.mark.parametrize("edit", [{"chosen": "float64"}, {"chosen": ["bfloat16"]}, {"reason": None}, {"key": "x"}])
def test_a_precision_cache_outside_its_set_is_measured_again(tmp_path, monkeypatch, edit):
    """A cached --dtype auto choice that names no dtype auto measures (a hand edit, another version) is
    stale: measured again and rewritten, never a KeyError when the model is cast."""
    from eagle.models import precision as precision_mod
    from eagle.records.files import atomic_write_json
    from tests.tiny import tiny_target
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    monkeypatch.setattr(precision_mod, "measure_dtypes", lambda t: {"float32": {1: 2.0, 8: 2.0},
                                                                 "bfloat16": {1: 1.0, 8: 1.0}})
    tiny = tiny_target()
    report = precision_mod.choose_cpu_dtype(tiny)
    path = Path(report.pop("file"))
    assert report.pop("measured") is True  # said of a fresh measurement, never stored
    atomic_write_json(path, {**report, **edit})
    assert precision_mod.choose_cpu_dtype(tiny)["chosen"] == "bfloat16"
    assert json.loads(path.read_text()) == report  # rewritten whole
