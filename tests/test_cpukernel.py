"""The AVX2 bf16 kernel (eagle.models.cpukernel): torch's bf16 Linear's numbers to fp32 rounding, each
row's result independent of how many rows share the call, weights shared, compiled into the cache once,
refused in one sentence where it cannot build, and chosen by auto only when timed faster."""
import pytest
import torch

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.models import cpukernel, kernels
from eagle.models.cpukernel import Bf16Linear, KernelUnavailable
from eagle.models.head import new_head
from eagle.models.kernels import linear_kernel, module_kernel, use_kernel
from tests.test_kernels import _timings
from tests.test_reliability import tiny_dir  # noqa: F401 (a fixture)
from tests.tiny import tiny_pair


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """The kernel compiled into a fresh cache (skips where this machine cannot build or run it)."""
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    try:
        return cpukernel.library()
    except KernelUnavailable as err:
        pytest.skip(str(err))


SHAPES = [(2, 576, 33), (2, 24, 6), (3, 13, 7), (4, 64, 10), (5, 40, 3), (6, 8, 5), (7, 19, 12), (8, 64, 1),
          (9, 32, 11), (11, 40, 50), (17, 96, 9)]


@pytest.mark.parametrize("rows,inputs,outputs", SHAPES)
def test_the_kernel_computes_the_linear(kernel, rows, inputs, outputs):
    """Every row count from 2 (one row runs torch's Linear): blocks of 8 and every remainder, widths with and
    without a tail past a multiple of 8, a bias."""
    linear = torch.nn.Linear(inputs, outputs).to(torch.bfloat16)
    wrapped = Bf16Linear.of(linear)
    x = torch.randn(2, rows, inputs).bfloat16()
    assert wrapped.weight is linear.weight and wrapped.active
    exact = x.float() @ linear.weight.float().T + linear.bias.float()
    torch.testing.assert_close(wrapped(x).float(), exact, rtol=1e-2, atol=1e-2)  # bf16 output rounding
    torch.testing.assert_close(wrapped(x.float()), exact, rtol=1e-5, atol=1e-5)  # fp32 rows: fp32 rounding


def test_a_rows_result_does_not_depend_on_the_rows_beside_it(kernel):
    """A token's logits are the same bits whether it is verified in a tree of 14 or in smaller calls (every
    blocking of the kernel; fp32 rows run the kernel even one at a time); a single bf16 row, a decoding
    step, is torch's Linear exactly."""
    weight = torch.randn(300, 576).bfloat16()
    x = torch.randn(14, 576)
    linear = Bf16Linear.wrapping(weight)
    together = linear(x)
    for size in (1, 2, 3, 4, 5, 7):
        assert torch.equal(together, torch.cat([linear(x[i:i + size]) for i in range(0, 14, size)]))
    step = x[:1].bfloat16()
    assert torch.equal(linear(step), torch.nn.functional.linear(step, weight))


def test_a_cast_runs_torchs_linear_and_a_model_keeps_its_tied_weights(kernel):
    linear = Bf16Linear.of(torch.nn.Linear(48, 80).to(torch.bfloat16)).to(torch.float32)
    x = torch.randn(4, 48)
    assert not linear.active
    torch.testing.assert_close(linear(x), x @ linear.weight.T + linear.bias)
    target, head = tiny_pair(vocab=40, eos=None)
    target.model.to(torch.bfloat16)
    tied = target.model.lm_head.weight
    assert use_kernel(target.model, "avx2") == 1 + 7 * target.config.num_hidden_layers
    assert target.model.lm_head.weight is tied and linear_kernel(target) == "avx2"


def test_bf16_on_the_kernel_decodes_as_bf16_on_torchs(kernel, single_thread):
    """Greedy bf16 output on the kernel equals bf16 on torch's Linear (the tiny model's logits are far from
    ties: the summation order changes nothing), and a tree decode equals its vanilla through the kernel."""
    target, head = tiny_pair(vocab=40, eos=None)
    target.model.to(torch.bfloat16)
    prompt, new = [4, 9, 2, 7, 7, 1], 24
    plain = DecodeConfig(mode="vanilla", max_new_tokens=new)
    torchs = generate(Decoder(target, None, plain), prompt).tokens
    use_kernel(target.model, "avx2")
    assert generate(Decoder(target, None, plain), prompt).tokens == torchs
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=new, total_tokens=8, depth=3, top_k=3)
    assert generate(Decoder(target, head, cfg), prompt).tokens == torchs


def test_no_compiler_is_one_sentence_and_bf16_stays_on_torchs_kernel(tmp_path, monkeypatch, tiny_dir):  # noqa: F811
    """A failed build leaves nothing behind, auto stays on torch's bf16 kernel and its reason says why."""
    from eagle.models import loader
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.074, 8: 0.123}, "bfloat16": {1: 0.037, 8: 0.145}},
             {"default": {"1": 74.0, "8": 123.0}, "onednn": {"1": 52.0, "8": 76.0}})
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(KernelUnavailable, match="^compiling the bf16 kernel with /bin/false failed"):
        cpukernel.library()
    assert not cpukernel.available() and kernels.fast_kernel("bfloat16") is None
    assert not list((tmp_path / "kernels").glob("*"))  # no half-built library left behind
    target = loader.load_target(str(tiny_dir), dtype="auto")
    assert linear_kernel(target) != "avx2"
    if not kernels.native_bf16():
        assert "; bf16 on torch's kernel: compiling the bf16 kernel with /bin/false failed" \
            in target.dtype_report["reason"]
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(KernelUnavailable, match="needs a C\\+\\+ compiler"):
        cpukernel.library()


def test_auto_runs_bf16_on_the_kernel_where_it_is_timed_faster(kernel, tmp_path, monkeypatch, tiny_dir):  # noqa: F811
    """The AVX2 EPYC's timings (2026-12-07): bf16 on torch's kernel t(8) 145 ms, on the AVX2 kernel 55,
    fp32 on oneDNN 76: trees take bf16 on the kernel, and an fp32 head beside it drafts on oneDNN."""
    from eagle.models import loader
    from eagle.tools.headprecision import set_head_dtype
    if kernels.fast_kernel("bfloat16") is None:
        pytest.skip("oneDNN runs bf16 natively here: the kernel is not offered")
    _timings(monkeypatch, tmp_path, {"float32": {1: 0.074, 8: 0.123}, "bfloat16": {1: 0.037, 8: 0.145}},
             {"default": {"1": 74.0, "8": 123.0}, "onednn": {"1": 52.0, "8": 76.0}},
             {"default": {"1": 37.3, "8": 145.2}, "avx2": {"1": 37.0, "8": 54.7}})
    target = loader.load_target(str(tiny_dir), dtype="auto")
    assert target.dtype == torch.bfloat16 and linear_kernel(target) == "avx2"
    assert "bfloat16 at the avx2 kernel's speed" in target.dtype_report["reason"]
    assert target.dtype_report["ms"]["bfloat16"]["8"] == pytest.approx(145 * 54.7 / 145.2, abs=0.01)
    head = new_head(target, seed=1)
    set_head_dtype(target, head, "float32")
    assert module_kernel(head) == "onednn"
    set_head_dtype(target, head, "bfloat16")
    assert module_kernel(head) == "avx2"
