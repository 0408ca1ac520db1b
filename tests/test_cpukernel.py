"""The AVX2 bf16 kernel (eagle.models.cpukernel): torch's bf16 Linear's numbers to fp32 rounding, each
row's result independent of how many rows share the call, weights shared, compiled into the cache once,
refused in one sentence where it cannot build (auto's choice of it: tests/test_kernels.py)."""
import shutil

import pytest
import torch

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.models import cpukernel, kernels
from eagle.models.cpukernel import Bf16Linear, KernelUnavailable
from eagle.models.kernels import linear_kernel, use_kernel
from tests.tiny import tiny_pair


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The kernel built once for this module, in a cache of its own (skips where it cannot be built)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EAGLE_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))
        try:
            cpukernel.library()
        except KernelUnavailable as err:
            pytest.skip(str(err))
        return cpukernel.library_path()


@pytest.fixture
def kernel(built, tmp_path, monkeypatch):
    """A fresh cache per test holding the module's build, loaded (no test builds it again)."""
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    path = cpukernel.library_path()
    path.parent.mkdir(parents=True)
    shutil.copy(built, path)
    return cpukernel.library()


def test_the_kernel_is_built_once_per_cache(kernel, monkeypatch):
    path = cpukernel.library_path()
    stamp = path.stat().st_mtime_ns
    monkeypatch.setattr(cpukernel, "_compile", lambda *args: pytest.fail("built again"))
    cpukernel.library()
    assert path.stat().st_mtime_ns == stamp


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


def test_no_compiler_is_one_sentence_and_nothing_is_left_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(KernelUnavailable, match="^compiling the bf16 kernel with /bin/false failed"):
        cpukernel.library()
    assert not cpukernel.available() and kernels.fast_kernel("bfloat16") != "avx2"
    assert not list((tmp_path / "kernels").glob("*"))  # no half-built library left behind
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(KernelUnavailable, match="needs a C\\+\\+ compiler"):
        cpukernel.library()
