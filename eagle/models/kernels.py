"""The projections' kernel per precision, where this CPU runs a faster one than torch's default: oneDNN with
prepacked weights for fp32, and for bf16 where oneDNN has native bf16 (AVX512_BF16, AMX); the AVX2 kernel of
eagle.models.cpukernel for bf16 on CPUs without bf16 instructions.

torch's default fp32 Linear on x86 builds is MKL's sgemm. On an AVX2 AMD EPYC (Zen 3, 2026-12-06) a projection
of 2-16 rows took twice to three times what oneDNN's kernel on a prepacked weight takes (the lm_head at 8
rows: 21.9 against 6.5 ms; `scripts/linear_kernels.py`), so every verify of a tree cost about twice a
one-token step (t(2) 88 ms, t(1) 54) and no tree could pay. torch's default bf16 Linear is oneDNN too, but
on an unpacked weight: on an AMD EPYC Zen 5 with AVX512_BF16 (2026-12-07, 2 threads) the same product on a
prepacked bf16 weight took a third to a half of its time (1-4 rows of 576 x 1536: 30-39 against 66-93 us),
SmolLM2-135M's t(8) 34 against 49 ms. `--dtype auto` times each precision's two kernels once per machine and
keeps the faster (cached like the dtype choice); an explicit `--dtype float32` stays torch's default path,
the reference the token-for-token tests run in. The same op serves torch.compile's CPU backend
(`torch.ops.mkldnn._linear_pointwise`)."""
from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from ..records.timing import time_interleaved
from . import cpukernel
from .cpukernel import Bf16Linear
from .head import AnyHead, cast_head, head_dtype
from .precision import DTYPE_PROBE_NS, DTYPES, cached_choice, decide_dtype, dtype_name, forward_job, machine_key
from .target import Target
from .wrapped import WrappedLinear

KERNELS: dict[str, tuple[str, ...]] = {"float32": ("default", "onednn"), "bfloat16": ("default", "avx2", "onednn")}


class PackedLinear(WrappedLinear):
    """An fp32 (or, where oneDNN has native bf16, a bf16) projection run by oneDNN on a prepacked copy of
    its weight; after a cast to a precision oneDNN does not pack here, a plain nn.Linear."""
    rows_hint = 8  # the layout is chosen for this many rows; any row count runs on it

    def _prepare(self) -> None:
        self.packed = _pack(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return super().forward(x)
        flat = x.reshape(-1, x.shape[-1])  # (..., in) -> (rows, in)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's layout of a CPU weight it packs (None for any other: it runs as torch's Linear)."""
    if not _packable(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PackedLinear.rows_hint)


def _packable(weight: torch.Tensor) -> bool:
    """fp32 on the CPU, and bf16 where oneDNN multiplies bf16 natively (elsewhere it emulates it)."""
    return weight.device.type == "cpu" and (weight.dtype == torch.float32
                                            or weight.dtype == torch.bfloat16 and onednn_bf16())


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def fast_kernel(dtype: str) -> str | None:
    """The kernel worth timing against torch's default for this precision here, or None: oneDNN for
    fp32; for bf16 oneDNN where it has native bf16, else the AVX2 kernel (where it compiles)."""
    if dtype == "float32":
        return "onednn" if onednn_available() else None
    if dtype != "bfloat16":
        return None
    if native_bf16():
        return "onednn" if onednn_available() and onednn_bf16() else None
    return "avx2" if cpukernel.available() else None


def onednn_bf16() -> bool:
    """oneDNN runs bf16 natively here and packs a bf16 weight: where bf16 projections run packed."""
    return native_bf16() and _packs_bf16()


@functools.cache
def _packs_bf16() -> bool:
    """oneDNN packs and multiplies a bf16 weight here (checked once on a tiny one): a build or CPU where
    it cannot then keeps bf16 on torch's kernel instead of failing a load."""
    try:
        weight = torch.ones(8, 8, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8, dtype=torch.bfloat16), packed, None, "none", [], "")
    except RuntimeError:
        return False
    return bool((out == 8).all())


def native_bf16() -> bool:
    """oneDNN runs bf16 products on this CPU's own instructions (AVX512_BF16, AMX, or AVX512 BW/VL/DQ)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def missing_kernel_note() -> str | None:
    """Where bf16 products are emulated and the AVX2 bf16 kernel could not be built: why (for the dtype
    choice's reason, so a user without a compiler learns what bf16 runs on)."""
    if native_bf16():
        return None
    why = cpukernel.why_unavailable()
    return None if why is None else f"bf16 on torch's kernel: {why}"


def use_kernel(model: nn.Module, kernel: str) -> int:
    """Every nn.Linear under `model` that `kernel` can run ("onednn": fp32, and bf16 where native; "avx2":
    bf16; "int8": bf16 with int8 weights) wrapped to run on it, in place; returns how many."""
    kind, fits = {"onednn": (PackedLinear, _packable), "avx2": (Bf16Linear, cpukernel.runs_on_kernel),
                  "int8": (Int8Linear, _int8_fits)}[kernel]
    count = 0
    for name, child in model.named_children():  # a projection on the other kernel (a cast head) moves over
        if type(child) in (nn.Linear, PackedLinear, Bf16Linear, Int8Linear) and type(child) is not kind \
                and fits(child.weight):
            setattr(model, name, kind.of(child))
            count += 1
        else:
            count += use_kernel(child, kernel)
    return count


class Int8Linear(WrappedLinear):
    """A bf16 CPU nn.Linear whose forward reads a weight-only int8 copy of its weight, one scale per output
    row (gpt-fast's int8 weight-only mode; torch's `_weight_int8pack_mm`): half the bytes a bf16 product
    reads. For the draft head, whose one layer and scoring rows are read cold after every verify (the
    target's weights have pushed them out of the caches): its drafts only propose, the target verifies
    every token, so greedy output stays the target's. After a cast off bf16, a plain nn.Linear."""

    def _prepare(self) -> None:
        self.quantized = _quantize_rows(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is None or x.dtype != torch.bfloat16:
            return super().forward(x)
        flat = x.reshape(-1, self.in_features).contiguous()  # (..., in) -> (rows, in)
        out = torch.ops.aten._weight_int8pack_mm(flat, *self.quantized)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def _quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int8 (out, in), bf16 scales (out,)) with weight ~ int8 * scale per row, symmetric; None for a
    weight the int8 kernel does not take (it runs as torch's Linear)."""
    if not _int8_fits(weight):
        return None
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales.to(torch.bfloat16)


def _int8_fits(weight: torch.Tensor) -> bool:
    """A bf16 CPU weight whose rows the int8 kernel multiplies correctly: its inner size a multiple of 16
    (torch 2.13 on an AMD EPYC, 2026-12-07: 8 crashed the process, 24 gave wrong sums; 16-1,536 were exact)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.shape[-1] % 16 == 0 \
        and int8_available()


@functools.cache
def int8_available() -> bool:
    """torch's int8 weight-only product runs here and gives the right sums (checked once, on a small
    product of a shape it takes)."""
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return False
    x = torch.arange(64, dtype=torch.float32).reshape(2, 32) / 64
    w = (torch.arange(96 * 32) % 7 - 3).reshape(96, 32).to(torch.int8)
    try:
        out = op(x.to(torch.bfloat16), w, torch.full((96,), 0.5, dtype=torch.bfloat16)).float()
    except RuntimeError:
        return False
    return bool(torch.allclose(out, 0.5 * x @ w.float().T, rtol=0.02, atol=0.02))


def pack_linears(model: nn.Module) -> int:
    """Every nn.Linear under `model` that oneDNN packs here as a PackedLinear, in place; returns how many."""
    return use_kernel(model, "onednn")


def wrap_weight(weight: torch.Tensor, kernel: str) -> nn.Module | None:
    """x -> x @ weight.T on `kernel` (the draft head's scoring rows), None on torch's default."""
    return {"onednn": PackedLinear.wrapping, "avx2": Bf16Linear.wrapping, "int8": Int8Linear.wrapping}[kernel](weight) \
        if kernel != "default" else None


def pack_beside(target: Target, module: nn.Module) -> int:
    """`module`'s projections on the fast kernel of their own precision where the target runs on a
    fast kernel (auto found one faster here): a draft head runs the same few-row shapes. Returns how
    many were wrapped."""
    if linear_kernel(target) == "default":
        return 0
    weights = [m.weight for m in module.modules() if isinstance(m, nn.Linear)]
    kernel = fast_kernel(dtype_name(weights[0].dtype)) if weights else None
    return use_kernel(module, kernel) if kernel else 0


INT8 = "int8"  # a head precision beside the DTYPES names: bf16 activations on int8 weights (Int8Linear)


def set_head_precision(target: Target, head: AnyHead, precision: str) -> AnyHead:
    """`head` (in place) drafting in `precision`: a DTYPES name, on its fast kernel where the target runs
    on one (pack_beside), or INT8: bf16 on int8 weights where the int8 kernel takes them."""
    dtype = torch.bfloat16 if precision == INT8 else DTYPES[precision]
    if dtype != head_dtype(head):
        cast_head(head, dtype, target.model.model.embed_tokens)
    pack_beside(target, head)
    if precision == INT8:
        use_kernel(head, INT8)
    return head


def head_precision(head: AnyHead) -> str:
    """What the head drafts in, as --head-dtype names it: "int8" on int8 weights, else its dtype's name."""
    return INT8 if module_kernel(head) == INT8 else dtype_name(head_dtype(head))


def fast_kernels_tag() -> str:
    """Which fast kernel each precision has here, for a cache key whose timings ran on them (the head's
    precision choice: a bf16 head timed on torch's kernel says nothing of one on oneDNN's)."""
    return ",".join(f"{d}-{fast_kernel(d) or 'default'}" for d in ("float32", "bfloat16"))


def linear_kernel(target: Target) -> str:
    """Which kernel the target's projections run on: "onednn" once packed, else "default"."""
    return module_kernel(target.model)


def kernel_tag(target: Target) -> str:
    """What a cache key adds for the target's kernel: nothing on torch's default, "|onednn" once packed."""
    kernel = linear_kernel(target)
    return "" if kernel == "default" else f"|{kernel}"


def module_kernel(module: nn.Module) -> str:
    """"onednn" when `module`'s projections run packed (PackedLinear), "avx2" when they run the AVX2
    bf16 kernel (Bf16Linear), "int8" on int8 weights (Int8Linear), else "default"."""
    for m in module.modules():
        if isinstance(m, Int8Linear) and m.quantized is not None:
            return "int8"
        if isinstance(m, PackedLinear) and m.packed is not None:
            return "onednn"
        if isinstance(m, Bf16Linear) and m.active:
            return "avx2"
    return "default"


def measure_kernels(target: Target, dtype: str = "float32", repeats: int = 15) -> dict[str, dict[str, float]]:
    """Median ms of a one-token and an 8-token forward in `dtype` on torch's default kernel and on its
    fast one, interleaved; `target` itself is left as it is (the fast kernel runs on a copy)."""
    copies = {}
    for kernel in ("default", fast_kernel(dtype)):
        if kernel == "default" and target.dtype == DTYPES[dtype]:
            copies[kernel] = target  # as loaded: no copy
            continue
        model = copy.deepcopy(target.model).to(DTYPES[dtype])
        if kernel != "default":
            use_kernel(model, kernel)
        copies[kernel] = Target(model, target.tokenizer, target.name)
    jobs = {(k, n): forward_job(t, n) for k, t in copies.items() for n in DTYPE_PROBE_NS}
    times = time_interleaved(jobs, repeats, desc=f"timing {dtype} kernels once for --dtype auto")
    return {k: {str(n): round(1000 * times[(k, n)], 2) for n in DTYPE_PROBE_NS} for k in copies}


def choose_linear_kernel(target: Target, dtype: str = "float32", refresh: bool = False, plain: bool = False) -> dict:
    """The faster kernel for this model's projections in `dtype` on this CPU, cached per model and
    machine: {"chosen", "ms": {kernel: {n: ms}}, "reason", "file"}; the least t(1) + t(8), or for plain
    decoding (`plain`) the least t(1)."""
    key = f"kernels|{target.name}|{machine_key(target.device)}"
    key = key if dtype == "float32" else f"kernels|{dtype}|{key.removeprefix('kernels|')}"
    report = cached_choice(key, lambda: measure_kernels(target, dtype), _reason(dtype), refresh,
                           options=KERNELS[dtype])
    if plain:
        chosen = min(report["ms"], key=lambda k: report["ms"][k]["1"])
        report = {**report, "chosen": chosen, "reason": _reason(dtype)(chosen, report["ms"])}
    return report


def at_their_kernels(dtype_report: dict, kernel_reports: dict[str, dict], plain: bool) -> dict:
    """The precision choice made again with each precision at its faster kernel's speed: the dtype probe
    timed both on torch's default kernel, so their times are scaled by the kernel ratio that was measured
    side by side (the measurements were made apart: ratios carry over, absolute times need not). On an
    AVX2 EPYC this turns bf16 (t(1) 43, t(8) 173 ms against fp32's 76 / 161) into fp32 on oneDNN
    (t(8) ~112), and with the AVX2 bf16 kernel into bf16 on it (t(8) ~65)."""
    ms, sped = {d: dict(v) for d, v in dtype_report["ms"].items()}, []
    for dtype, kernels in kernel_reports.items():
        kernel = kernels["chosen"]
        if kernel == "default" or dtype not in ms:
            continue
        default, fast = kernels["ms"]["default"], kernels["ms"][kernel]
        ms[dtype] = {n: round(t * fast[n] / default[n], 2) for n, t in ms[dtype].items()}
        sped.append(f"{dtype} at the {kernel} kernel's speed")
    if not sped:
        return dtype_report
    report = decide_dtype(dtype_report, ms, plain)
    return {**report, "reason": f"{report['reason']}; {', '.join(sped)}"}


def _reason(dtype: str):
    short = {"float32": "fp32", "bfloat16": "bf16"}[dtype]

    def reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
        parts = ", ".join(f"{k}: t(1) {v['1']:.0f} ms, t(8) {v['8']:.0f} ms" for k, v in ms.items())
        return f"{short} projections on the {chosen} kernel, the faster here ({parts}; measured once, cached)"
    return reason
