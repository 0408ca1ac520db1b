"""The draft head's own precision (--head-dtype): cast apart from the target, lossless beside it, chosen
by a measurement cached per machine, and recorded where speeds are read."""
import json

import pytest
import torch

from eagle import cli
from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate, new_drafter
from eagle.models.head import cast_head, head_dtype, new_head
from eagle.models.headio import head_sha256
from eagle.models.kernels import Int8Linear, head_precision, int8_available, module_kernel
from eagle.tools import headprecision
from eagle.tools.budget.costs import cost_key
from eagle.tools.session import Session
from tests.tiny import tiny_pair


def _target_dtypes(target) -> set[torch.dtype]:
    return {p.dtype for p in target.model.parameters()}


def test_cast_head_leaves_the_target_and_its_shared_embedding_alone(single_thread):
    target, head = tiny_pair(vocab=40)
    embed = target.model.model.embed_tokens
    assert head.embed_tokens is embed
    cast_head(head, torch.bfloat16, embed)
    assert head_dtype(head) == torch.bfloat16 and head.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert head.embed_tokens is embed and _target_dtypes(target) == {torch.float32}
    drafter = new_drafter(target, head, 64)  # the target's lm_head rows, copied into the head's precision
    assert drafter.weight.dtype == torch.bfloat16 and target.model.lm_head.weight.dtype == torch.float32
    root = drafter.consume(torch.tensor([3, 5, 7]), torch.randn(3, target.config.hidden_size))
    assert root.dtype == torch.bfloat16 and drafter.log_probs(root).dtype == torch.float32


def test_a_bf16_head_beside_an_fp32_target_decodes_as_vanilla(single_thread):
    """Greedy output is the target's whatever the head drafts in, static and dynamic trees alike."""
    target, head = tiny_pair(vocab=40, eos=None)
    prompt = [4, 9, 2, 7, 7, 1]
    vanilla = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=24)), prompt).tokens
    cast_head(head, torch.bfloat16, target.model.model.embed_tokens)
    for mode in ("dynamic", "static"):
        cfg = DecodeConfig(mode=mode, max_new_tokens=24, total_tokens=8, depth=3, top_k=3)
        assert generate(Decoder(target, head, cfg), prompt).tokens == vanilla, mode


@pytest.mark.slow
def test_the_trained_head_in_bf16_keeps_fp32_greedy_exact_and_drafts_as_well(target, mt_prompts):
    """The real model in fp32 (the exact reference) with the shipped head cast to bf16: every token is
    vanilla's, and the head's acceptance stays that of a trained head (tau well above 1)."""
    from eagle.models.headio import load_head, shipped_head_path
    head = load_head(shipped_head_path(target.name), target, dtype=torch.bfloat16)
    assert head_dtype(head) == torch.bfloat16 and _target_dtypes(target) == {torch.float32}
    session = Session.of(target, head, "shipped")
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=40, total_tokens=12, depth=3, top_k=4)
    vanilla_cfg = DecodeConfig(mode="vanilla", max_new_tokens=40)
    taus = []
    for q in mt_prompts[:2]:
        run = session.prepare(q["turns"][0], cfg)
        eagle = generate(run.decoder, run.ids)
        assert eagle.tokens == generate(session.prepare(q["turns"][0], vanilla_cfg).decoder, run.ids).tokens
        assert run.header.meta["head_dtype"] == "bfloat16" and run.header.meta["dtype"] == "float32"
        taus.append(eagle.tau)
    assert sum(taus) / len(taus) > 1.8, taus


def test_auto_times_the_head_once_per_machine_and_caches_it(tmp_path, monkeypatch, single_thread):
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    target, head = tiny_pair(vocab=40)
    why = headprecision.set_head_dtype(target, head, "auto")
    report = headprecision.choose_head_dtype(target, head)
    ms = report["ms"]
    assert set(ms) == set(headprecision.auto_options()) and all(v["draft"] > 0 for v in ms.values())
    assert report["chosen"] == min(ms, key=lambda d: ms[d]["draft"]) and why == report["reason"]
    assert head_precision(head) == report["chosen"] and _target_dtypes(target) == {torch.float32}
    calls = []
    monkeypatch.setattr(headprecision, "time_head_dtypes", lambda *a: calls.append(a) or {})
    assert headprecision.set_head_dtype(target, head, "auto") == why and not calls  # read from the cache
    report = json.loads(open(report["file"]).read())
    assert report["key"].startswith("head|tiny-llama|eagle1|")


def test_named_and_target_precisions(single_thread):
    target, head = tiny_pair(vocab=40)
    assert headprecision.set_head_dtype(target, head, "float16") is None and head_dtype(head) == torch.float16
    fp16_key = cost_key(target, head)
    assert headprecision.set_head_dtype(target, head, "target") is None and head_dtype(head) == torch.float32
    assert fp16_key.endswith("|head=float16") and cost_key(target, head) != fp16_key  # costs are per head dtype
    with pytest.raises(ValueError, match="unknown head dtype 'float64'"):
        headprecision.set_head_dtype(target, head, "float64")


def test_headers_record_the_head_precision_only_where_it_drafts(single_thread):
    target, head = tiny_pair(vocab=40)
    cast_head(head, torch.bfloat16, target.model.model.embed_tokens)
    session = Session.of(target, head, "random")
    dyn = session.header("hi", DecodeConfig(mode="dynamic"), 3)
    van = session.header("hi", DecodeConfig(mode="vanilla"), 3)
    assert dyn.meta["head_dtype"] == "bfloat16" and "head_dtype" not in van.meta


def test_a_head_dtype_flag_outside_the_choices_is_one_sentence(capsys):
    assert cli.main(["generate", "--prompt", "hi", "--head-dtype", "float64"]) == 2
    err = capsys.readouterr().err
    assert "--head-dtype" in err and "float64" in err and "Traceback" not in err


def test_new_heads_keep_the_targets_precision():
    target, _ = tiny_pair(vocab=40)
    target.model.to(torch.bfloat16)
    head = new_head(target)
    assert head_dtype(head) == torch.bfloat16 and head.embed_tokens is target.model.model.embed_tokens


needs_int8 = pytest.mark.skipif(not int8_available(), reason="torch's int8 weight-only kernel does not run here")


@needs_int8
def test_an_int8_linear_multiplies_its_rounded_weights():
    """One int8 weight and scale per row: the product is x @ (q * scale).T to bf16 rounding, within a
    percent of the bf16 product; the bf16 Parameter stays (hashes read it); off bf16, or an inner size
    the kernel does not take, it is torch's Linear."""
    linear = torch.nn.Linear(48, 80).to(torch.bfloat16)
    int8 = Int8Linear.of(linear)
    q, scales = int8.quantized
    assert int8.weight is linear.weight and q.dtype == torch.int8 and q.abs().max() == 127
    x = torch.randn(3, 5, 48).to(torch.bfloat16)
    rounded = (q.float() * scales.float()[:, None]).T
    torch.testing.assert_close(int8(x).float(), x.float() @ rounded + linear.bias.float(), rtol=2e-2, atol=2e-2)
    error = (int8(x).float() - linear(x).float()).norm() / linear(x).float().norm()
    assert error < 0.01
    assert int8.to(torch.float32).quantized is None
    torch.testing.assert_close(int8(x.float()), torch.nn.functional.linear(x.float(), int8.weight, int8.bias))
    assert int8.to(torch.bfloat16).quantized is not None
    assert Int8Linear.of(torch.nn.Linear(24, 8).to(torch.bfloat16)).quantized is None  # 24 columns: refused


@needs_int8
def test_an_int8_head_decodes_as_vanilla_and_says_so(single_thread):
    """--head-dtype int8: the bf16 head on int8 weights, its scoring rows too; greedy output stays
    vanilla's (static and dynamic), the head's version is the bf16 head's (the weights are kept), and the
    cost key and the trace header name it."""
    from eagle.core.decode import new_drafter
    target, head = tiny_pair(vocab=40, eos=None)
    prompt = [4, 9, 2, 7, 7, 1]
    vanilla = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=24)), prompt).tokens
    _, twin = tiny_pair(vocab=40, eos=None)
    headprecision.set_head_dtype(target, twin, "bfloat16")
    headprecision.set_head_dtype(target, head, "int8")
    assert head_precision(head) == "int8" == module_kernel(head) and head_dtype(head) == torch.bfloat16
    assert head_sha256(head) == head_sha256(twin) and cost_key(target, head).endswith("|head-int8")
    assert isinstance(new_drafter(target, head, 64)._project, Int8Linear)
    for mode in ("dynamic", "static"):
        cfg = DecodeConfig(mode=mode, max_new_tokens=24, total_tokens=8, depth=3, top_k=3)
        assert generate(Decoder(target, head, cfg), prompt).tokens == vanilla, mode
    header = Session.of(target, head, None).header("hi", DecodeConfig(), 2)
    assert header.meta["head_dtype"] == "int8"


def test_int8_where_its_kernel_does_not_run_is_one_sentence(monkeypatch, single_thread):
    from eagle.models import kernels
    target, head = tiny_pair(vocab=40)
    monkeypatch.setattr(headprecision, "int8_available", lambda: False)
    monkeypatch.setattr(kernels, "int8_available", lambda: False)
    with pytest.raises(ValueError, match="int8 weight-only CPU kernel, which this machine does not run"):
        headprecision.set_head_dtype(target, head, "int8")
    assert headprecision.auto_options() == ("float32", "bfloat16")


def test_scoring_rows_are_made_once_per_vocabulary_and_precision(single_thread):
    """A generation's Drafter reuses the rows an earlier one made (no copy, pack or quantization per
    generation); another vocabulary, another precision or rows changed in place are made again, and a
    copy of the head starts without them."""
    import copy
    from eagle.core.decode import new_drafter
    target, head = tiny_pair(vocab=40)
    head.token_counts = torch.arange(40, dtype=torch.float32)  # FR-Spec needs counts to pick a subset
    first, again = new_drafter(target, head, 64, 16), new_drafter(target, head, 64, 16)
    assert again.weight is first.weight and again.vocab_ids is first.vocab_ids and first.weight.shape == (16, 32)
    assert new_drafter(target, head, 64, 8).weight.shape[0] == 8
    with torch.no_grad():
        target.model.lm_head.weight.mul_(2)  # rows changed in place: made again, from the new values
    doubled = new_drafter(target, head, 64, 16)
    assert doubled.weight is not first.weight
    torch.testing.assert_close(doubled.weight, 2 * first.weight)
    cast_head(head, torch.bfloat16, target.model.model.embed_tokens)
    assert new_drafter(target, head, 64, 16).weight.dtype == torch.bfloat16
    assert not copy.deepcopy(head, {id(head.embed_tokens): head.embed_tokens}).scoring_rows.made
