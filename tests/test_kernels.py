"""fp32 projections on oneDNN's prepacked kernel (eagle.models.kernels): the same numbers as torch's Linear
to fp32 rounding, the weights still shared, greedy decoding still exact, chosen by a cached measurement."""
import pytest
import torch

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.models import kernels
from eagle.models.kernels import PackedLinear, linear_kernel, onednn_available, pack_linears
from eagle.tools.budget.costs import cost_key
from eagle.tools.session import Session
from tests.test_cpukernel import built, kernel  # noqa: F401 (fixtures)
from tests.test_reliability import tiny_dir  # noqa: F401 (a fixture)
from tests.tiny import tiny_pair

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 8, 17])
def test_a_packed_linear_computes_the_linear(rows):
    linear = torch.nn.Linear(48, 80)
    packed = PackedLinear.of(linear)
    x = torch.randn(2, rows, 48)
    assert packed.weight is linear.weight and packed(x).shape == (2, rows, 80)
    torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_packing_keeps_tied_weights_and_decoding_exact(single_thread):
    target, head = tiny_pair(vocab=40, eos=None)
    prompt, new = [4, 9, 2, 7, 7, 1], 24
    vanilla = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=new)), prompt).tokens
    unpacked_key = cost_key(target, head)
    lm_weight = target.model.lm_head.weight
    assert pack_linears(target.model) == 1 + 7 * target.config.num_hidden_layers  # lm_head + q,k,v,o,gate,up,down
    assert target.model.lm_head.weight is lm_weight and linear_kernel(target) == "onednn"
    assert cost_key(target, head) == unpacked_key + "|onednn"  # its costs are its own
    packed_vanilla = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=new)), prompt).tokens
    assert packed_vanilla == vanilla  # the tiny model's logits are far from ties: fp32 rounding changes nothing
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=new, total_tokens=8, depth=3, top_k=3)
    assert generate(Decoder(target, head, cfg), prompt).tokens == vanilla
    assert Session.of(target, head, "random").header("hi", cfg, 3).meta["linear_kernel"] == "onednn"


def test_the_kernel_choice_is_measured_once_and_cached(tmp_path, monkeypatch, single_thread):
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    target, _ = tiny_pair(vocab=40)
    report = kernels.choose_linear_kernel(target)
    ms = report["ms"]
    assert set(ms) == {"default", "onednn"} and report["chosen"] == min(ms, key=lambda k: sum(ms[k].values()))
    assert linear_kernel(target) == "default"  # measured on a copy
    monkeypatch.setattr(kernels, "measure_kernels", lambda t, dtype: pytest.fail("measured again"))
    assert kernels.choose_linear_kernel(target)["chosen"] == report["chosen"]


def _timings(monkeypatch, cache, dtypes: dict, kernel_ms: dict, bf16_ms: dict | None = None) -> None:
    """A fresh cache and the dtype and kernel probes answering with these timings (s and ms): `kernel_ms`
    fp32's, `bf16_ms` bf16's (timed only where a faster bf16 kernel is offered; default: torch's is faster)."""
    from eagle.models import precision
    bf16_ms = bf16_ms or {"default": {"1": 1.0, "8": 1.0}, kernels.fast_kernel("bfloat16") or "avx2": {"1": 2.0, "8": 2.0}}
    monkeypatch.setenv("EAGLE_CACHE", str(cache))
    monkeypatch.setattr(precision, "measure_dtypes", lambda t: dtypes)
    monkeypatch.setattr(kernels, "measure_kernels", lambda t, dtype: kernel_ms if dtype == "float32" else bf16_ms)
    monkeypatch.setattr(precision, "one_token_seconds", lambda t: 1e3)  # the machine now: never faster than cached


def test_auto_packs_only_where_it_chose_fp32_and_onednn(tmp_path, monkeypatch, tiny_dir):  # noqa: F811
    """--dtype auto on a CPU: fp32 chosen and oneDNN timed faster -> packed; an explicit float32 is not,
    unless asked for its faster kernel (bench's baseline in another precision)."""
    from eagle.models import loader
    _timings(monkeypatch, tmp_path, {"float32": {1: 1.0, 8: 1.0}, "bfloat16": {1: 2.0, 8: 2.0}},
             {"default": {"1": 2.0, "8": 4.0}, "onednn": {"1": 2.0, "8": 2.0}})
    auto = loader.load_target(str(tiny_dir), dtype="auto")
    assert linear_kernel(auto) == "onednn" and "onednn kernel" in auto.kernel_report["reason"]
    assert linear_kernel(loader.load_target(str(tiny_dir), dtype="float32")) == "default"
    baseline = loader.load_target(str(tiny_dir), dtype="float32", fastest_kernel=True)
    assert linear_kernel(baseline) == "onednn" and baseline.dtype_report is None
    assert "onednn kernel" in baseline.kernel_report["reason"]


def test_a_wrapped_weight_and_a_cast_keep_the_linear():
    """The draft head's scoring rows run packed as a bare weight; a packed Linear cast to bf16 packs again
    where oneDNN has native bf16 and runs as torch's Linear elsewhere, one cast to fp16 runs as torch's
    Linear (nothing stale), and cast back to fp32 packs again."""
    weight = torch.randn(300, 48)
    x = torch.randn(5, 48)
    torch.testing.assert_close(PackedLinear.wrapping(weight)(x), x @ weight.T, rtol=1e-5, atol=1e-5)
    linear = torch.nn.Linear(48, 80)
    packed = PackedLinear.of(linear).to(torch.bfloat16)
    assert (packed.packed is not None) == kernels.native_bf16()
    plain = torch.nn.functional.linear(x.bfloat16(), packed.weight, packed.bias)
    torch.testing.assert_close(packed(x.bfloat16()), plain, rtol=2e-2, atol=2e-2)  # bf16: a few roundings apart
    assert packed.to(torch.float16).packed is None and packed(x.half()).dtype == torch.float16
    assert packed.to(torch.float32).packed is not None
    torch.testing.assert_close(packed(x), x @ packed.weight.T + packed.bias, rtol=1e-5, atol=1e-5)


def test_an_fp32_head_beside_a_packed_target_drafts_packed_and_exact(single_thread):
    """set_head_dtype packs an fp32 head where the target is packed (not beside a default target; a bf16
    one only where oneDNN has native bf16); its drafts score through oneDNN, the cost key says so, and
    greedy output stays vanilla's."""
    from eagle.core.decode import new_drafter
    from eagle.models.head import cast_head
    from eagle.models.kernels import module_kernel
    from eagle.tools.headprecision import set_head_dtype
    target, head = tiny_pair(vocab=40, eos=None)
    prompt, new = [4, 9, 2, 7, 7, 1], 24
    vanilla = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=new)), prompt).tokens
    set_head_dtype(target, head, "float32")
    assert module_kernel(head) == "default"  # the target runs torch's kernel: so does the head
    unpacked = new_drafter(target, head, 64)
    root = unpacked.consume(torch.tensor([3, 5, 7]), torch.randn(3, target.config.hidden_size))
    pack_linears(target.model)
    set_head_dtype(target, head, "float32")
    assert module_kernel(head) == "onednn" and head.embed_tokens is target.model.model.embed_tokens
    assert cost_key(target, head).endswith("|onednn|head-onednn")
    drafter = new_drafter(target, head, 64)
    assert drafter._project is not None and drafter.weight is target.model.lm_head.weight
    torch.testing.assert_close(drafter.log_probs(root), unpacked.log_probs(root), rtol=1e-4, atol=1e-4)
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=new, total_tokens=8, depth=3, top_k=3)
    assert generate(Decoder(target, head, cfg), prompt).tokens == vanilla
    cast_head(head, torch.bfloat16, target.model.model.embed_tokens)  # packs again where bf16 is native
    packed_bf16 = kernels.native_bf16()
    assert module_kernel(head) == ("onednn" if packed_bf16 else "default")
    assert (new_drafter(target, head, 64)._project is not None) == packed_bf16
    assert generate(Decoder(target, head, cfg), prompt).tokens == vanilla


def test_auto_weighs_bf16_against_fp32_at_its_faster_kernel(tmp_path, monkeypatch, tiny_dir):  # noqa: F811
    """The AVX2 EPYC's timings: on torch's default kernel bf16 wins for trees (t(1) + t(8) 216 against
    fp32's 237 ms), but fp32 on oneDNN verifies 8 tokens in 78/112 of the time: trees take fp32 packed,
    plain decoding still takes bf16 (its one-token step is faster)."""
    from eagle.models import loader
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.076, 8: 0.161}, "bfloat16": {1: 0.043, 8: 0.173}},
             {"default": {"1": 62.0, "8": 112.0}, "onednn": {"1": 62.0, "8": 78.0}})
    trees = loader.load_target(str(tiny_dir), dtype="auto")
    assert trees.dtype == torch.float32 and linear_kernel(trees) == "onednn"
    assert trees.dtype_report["ms"]["float32"]["8"] == pytest.approx(161 * 78 / 112, abs=0.01)
    assert "at the onednn kernel's speed" in trees.dtype_report["reason"]
    plain = loader.load_target(str(tiny_dir), dtype="auto", plain=True)
    assert plain.dtype == torch.bfloat16 and linear_kernel(plain) == "default"
    monkeypatch.setattr(kernels, "measure_kernels", lambda t, dtype: {"default": {"1": 62.0, "8": 112.0},
                                                                      "onednn": {"1": 70.0, "8": 120.0}})
    kernels.choose_linear_kernel(trees, refresh=True)  # the default kernel is faster: bf16 stays chosen
    assert loader.load_target(str(tiny_dir), dtype="auto").dtype == torch.bfloat16


# ---- bf16 on the AVX2 kernel (eagle.models.cpukernel), as --dtype auto chooses it ----------------------
def test_auto_says_why_bf16_stays_on_torchs_kernel_without_a_compiler(tmp_path, monkeypatch, tiny_dir):  # noqa: F811
    from eagle.models import loader
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.074, 8: 0.123}, "bfloat16": {1: 0.037, 8: 0.145}},
             {"default": {"1": 74.0, "8": 123.0}, "onednn": {"1": 52.0, "8": 76.0}})
    monkeypatch.setenv("CXX", "/bin/false")
    target = loader.load_target(str(tiny_dir), dtype="auto")
    assert linear_kernel(target) != "avx2"
    if not kernels.native_bf16():
        assert "; bf16 on torch's kernel: compiling the bf16 kernel with /bin/false failed" \
            in target.dtype_report["reason"]


def test_auto_runs_bf16_on_the_kernel_where_it_is_timed_faster(kernel, tmp_path, monkeypatch, tiny_dir):  # noqa: F811
    """The AVX2 EPYC's timings (2026-12-07): bf16 on torch's kernel t(8) 145 ms, on the AVX2 kernel 55,
    fp32 on oneDNN 76: trees take bf16 on the kernel, and a head beside it drafts on its own precision's.
    Where oneDNN has native bf16 its packed bf16 is the kernel offered instead (Zen 5: t(8) 34 against 49)."""
    from eagle.models import loader
    from eagle.models.head import new_head
    from eagle.models.kernels import module_kernel
    from eagle.tools.headprecision import set_head_dtype
    fast = kernels.fast_kernel("bfloat16")
    if fast is None:
        pytest.skip("no faster bf16 kernel here: no native bf16 and the AVX2 kernel is not built")
    assert fast == ("onednn" if kernels.native_bf16() else "avx2")
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.074, 8: 0.123}, "bfloat16": {1: 0.037, 8: 0.145}},
             {"default": {"1": 74.0, "8": 123.0}, "onednn": {"1": 52.0, "8": 76.0}},
             {"default": {"1": 37.3, "8": 145.2}, fast: {"1": 37.0, "8": 54.7}})
    target = loader.load_target(str(tiny_dir), dtype="auto")
    assert target.dtype == torch.bfloat16 and linear_kernel(target) == fast
    assert f"bfloat16 at the {fast} kernel's speed" in target.dtype_report["reason"]
    assert target.dtype_report["ms"]["bfloat16"]["8"] == pytest.approx(145 * 54.7 / 145.2, abs=0.01)
    head = new_head(target, seed=1)
    set_head_dtype(target, head, "float32")
    assert module_kernel(head) == "onednn"
    set_head_dtype(target, head, "bfloat16")
    assert module_kernel(head) == fast


def test_budget_refresh_times_the_precision_kernel_and_head_choices_again(tmp_path, monkeypatch, tiny_dir,  # noqa: F811
                                                                          capsys):
    """A precision choice cached while other work shared the cores (bf16 timed 7x slower than fp32 on a
    CPU where it is the faster) stays wrong until measured again: `budget --refresh` re-times every
    machine measurement behind the budget, not only the tree costs."""
    from eagle import cli
    from eagle.tools import headprecision
    from eagle.tools.budget import choice as budget_choice
    from tests.tiny import context_auto_report
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.25, 8: 2.9}, "bfloat16": {1: 1.9, 8: 2.3}},
             {"default": {"1": 2.0, "8": 4.0}, "onednn": {"1": 2.0, "8": 2.0}})
    timed = []
    monkeypatch.setattr(headprecision, "time_head_dtypes",
                        lambda t, h, dtypes: timed.append("head") or {"float32": {"draft": 2.0}, "bfloat16": {"draft": 1.0}})
    report = context_auto_report()
    monkeypatch.setattr(budget_choice, "auto_config", lambda t, h, cfg, **kw: (cfg, report))
    flags = ["budget", "--model", str(tiny_dir), "--head", "random", "--threads", "1"]
    assert cli.main(flags) == 0
    assert "dtype: float32" in capsys.readouterr().out and timed == ["head"]
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.040, 8: 0.060}, "bfloat16": {1: 0.020, 8: 0.025}},
             {"default": {"1": 2.0, "8": 4.0}, "onednn": {"1": 2.0, "8": 2.0}})
    assert cli.main(flags) == 0  # read from the cache: the wrong choice stays
    assert "dtype: float32" in capsys.readouterr().out and timed == ["head"]
    assert cli.main([*flags, "--refresh"]) == 0
    assert "dtype: bfloat16" in capsys.readouterr().out and timed == ["head", "head"]


def test_a_precision_cache_timed_under_load_is_measured_again_on_load(tmp_path, monkeypatch, tiny_dir,  # noqa: F811
                                                                      capsys):
    """What `budget --refresh` repairs by hand, a load notices: the cached fp32 one-token forward (250 ms, timed
    beside other work) is far slower than a quick probe of the freshly loaded target now, so the precision, the
    kernels and the head's precision are timed again; a cache the machine agrees with is read as it is."""
    from eagle import cli
    from eagle.models import precision
    from eagle.tools import headprecision
    from eagle.tools.budget import choice as budget_choice
    from tests.tiny import context_auto_report
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.25, 8: 2.9}, "bfloat16": {1: 1.9, 8: 2.3}},
             {"default": {"1": 2.0, "8": 4.0}, "onednn": {"1": 2.0, "8": 2.0}})
    timed = []
    monkeypatch.setattr(headprecision, "time_head_dtypes",
                        lambda t, h, dtypes: timed.append("head") or {"float32": {"draft": 2.0}, "bfloat16": {"draft": 1.0}})
    monkeypatch.setattr(budget_choice, "auto_config", lambda t, h, cfg, **kw: (cfg, context_auto_report()))
    flags = ["budget", "--model", str(tiny_dir), "--head", "random", "--threads", "1"]
    assert cli.main(flags) == 0 and "dtype: float32" in capsys.readouterr().out
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.040, 8: 0.060}, "bfloat16": {1: 0.020, 8: 0.025}},
             {"default": {"1": 2.0, "8": 4.0}, "onednn": {"1": 2.0, "8": 2.0}})
    monkeypatch.setattr(precision, "one_token_seconds", lambda t: 0.200)  # cached 250 ms: not > 1.5 x 200 ms
    assert cli.main(flags) == 0 and "dtype: float32" in capsys.readouterr().out and timed == ["head"]
    monkeypatch.setattr(precision, "one_token_seconds", lambda t: 0.040)  # 250 ms cached against 40 now
    assert cli.main(flags) == 0
    out = capsys.readouterr()
    assert "dtype: bfloat16" in out.out and timed == ["head", "head"]
    assert "measured again: the cached timings were made under load" in out.out + out.err
    assert cli.main(flags) == 0 and "dtype: bfloat16" in capsys.readouterr().out  # the new cache stands
    assert timed == ["head", "head"]


def test_bf16_is_not_offered_packed_where_onednn_cannot_pack_it(monkeypatch):
    """A build or CPU whose oneDNN refuses a bf16 weight keeps bf16 on torch's kernel (nothing packs it, no
    load fails); the check runs once."""
    def refuse(*args):
        raise RuntimeError("could not create a primitive descriptor")
    kernels._packs_bf16.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    monkeypatch.setattr(kernels, "native_bf16", lambda: True)
    try:
        assert kernels.fast_kernel("bfloat16") is None
        assert PackedLinear.of(torch.nn.Linear(8, 8).to(torch.bfloat16)).packed is None
    finally:
        kernels._packs_bf16.cache_clear()
