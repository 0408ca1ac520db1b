"""fp32 projections through oneDNN with prepacked weights, where this CPU runs them faster.

torch's default fp32 Linear on x86 builds is MKL's sgemm. On an AVX2 AMD EPYC (Zen 3, 2026-12-06) a projection
of 2-16 rows took twice to three times what oneDNN's kernel on a prepacked weight takes (the lm_head at 8
rows: 21.9 against 6.5 ms; `scripts/linear_kernels.py`), so every verify of a tree cost about twice a
one-token step (t(2) 88 ms, t(1) 54) and no tree could pay. `--dtype auto` times both kernels once per
machine when it runs fp32 and keeps the faster (cached like the dtype choice); an explicit `--dtype float32`
stays torch's default path, the reference the token-for-token tests run in. The same op serves
torch.compile's CPU backend (`torch.ops.mkldnn._linear_pointwise`)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..records.timing import time_interleaved
from .precision import DTYPE_PROBE_NS, cached_choice, decide_dtype, forward_job, machine_key
from .target import Target

KERNELS = ("default", "onednn")


class PackedLinear(nn.Linear):
    """An fp32 nn.Linear whose forward runs oneDNN on a prepacked copy of its weight; `weight` stays the
    same Parameter (a tied embedding, the draft head's scoring rows and weight hashes read it). For
    inference: a weight changed in place is not seen, a cast (.to) packs again (or, off fp32 on the CPU,
    runs as a plain nn.Linear)."""
    rows_hint = 8  # the layout is chosen for this many rows; any row count runs on it

    @classmethod
    def of(cls, linear: nn.Linear) -> "PackedLinear":
        return cls.wrapping(linear.weight, linear.bias)

    @classmethod
    def wrapping(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "PackedLinear":
        """x -> x @ weight.T + bias on oneDNN, for a weight (out, in) that is no nn.Linear's (the draft
        head's scoring rows)."""
        packed = cls.__new__(cls)
        nn.Module.__init__(packed)
        packed.out_features, packed.in_features = weight.shape
        packed.weight, packed.bias = weight, bias  # Parameters stay registered; plain tensors stay attributes
        packed.packed = _pack(weight)
        return packed

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.packed = _pack(self.weight)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return super().forward(x)
        flat = x.reshape(-1, x.shape[-1])  # (..., in) -> (rows, in)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's layout of an fp32 CPU weight (None for any other: it runs as torch's Linear)."""
    if not _packable(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PackedLinear.rows_hint)


def _packable(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.float32 and weight.device.type == "cpu"


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack_linears(model: nn.Module) -> int:
    """Every fp32 CPU nn.Linear under `model` as a PackedLinear, in place; returns how many."""
    count = 0
    for name, child in model.named_children():
        if type(child) is nn.Linear and _packable(child.weight):
            setattr(model, name, PackedLinear.of(child))
            count += 1
        else:
            count += pack_linears(child)
    return count


def pack_beside(target: Target, module: nn.Module) -> int:
    """`module`'s fp32 projections on the target's kernel: packed when the target's are (a draft head
    drafting in fp32 beside it runs the same few-row shapes). Returns how many were packed."""
    return pack_linears(module) if linear_kernel(target) == "onednn" else 0


def linear_kernel(target: Target) -> str:
    """Which kernel the target's projections run on: "onednn" once packed, else "default"."""
    return module_kernel(target.model)


def kernel_tag(target: Target) -> str:
    """What a cache key adds for the target's kernel: nothing on torch's default, "|onednn" once packed."""
    kernel = linear_kernel(target)
    return "" if kernel == "default" else f"|{kernel}"


def module_kernel(module: nn.Module) -> str:
    """"onednn" when `module`'s projections run packed (PackedLinear), else "default"."""
    return "onednn" if any(isinstance(m, PackedLinear) and m.packed is not None for m in module.modules()) \
        else "default"


def measure_kernels(target: Target, repeats: int = 15) -> dict[str, dict[str, float]]:
    """Median ms of a one-token and an 8-token forward with each kernel, interleaved, on a packed copy."""
    packed = copy.deepcopy(target.model)
    pack_linears(packed)
    copies = {"default": target, "onednn": Target(packed, target.tokenizer, target.name)}
    jobs = {(k, n): forward_job(t, n) for k, t in copies.items() for n in DTYPE_PROBE_NS}
    times = time_interleaved(jobs, repeats, desc="timing fp32 kernels once for --dtype auto")
    return {k: {str(n): round(1000 * times[(k, n)], 2) for n in DTYPE_PROBE_NS} for k in copies}


def choose_linear_kernel(target: Target, refresh: bool = False) -> dict:
    """The faster fp32 kernel for this model on this CPU (least t(1) + t(8)), cached per model and machine:
    {"chosen", "ms": {kernel: {n: ms}}, "reason", "file"}."""
    key = f"kernels|{target.name}|{machine_key(target.device)}"
    return cached_choice(key, lambda: measure_kernels(target), _reason, refresh, options=KERNELS)


def fp32_at_its_kernel(dtype_report: dict, kernel_report: dict, plain: bool) -> dict:
    """The precision choice made again with fp32 at its faster kernel's speed: the dtype probe timed fp32
    on torch's default kernel, so its fp32 times are scaled by the kernel ratio that was measured side by
    side (the two measurements were made apart: ratios carry over, absolute times need not). On an AVX2
    EPYC this turns bf16 (t(1) 43, t(8) 173 ms against fp32's 76 / 161) into fp32 on oneDNN (t(8) ~112)."""
    kernel, ms = kernel_report["chosen"], {d: dict(v) for d, v in dtype_report["ms"].items()}
    if kernel == "default" or "float32" not in ms:
        return dtype_report
    default, fast = kernel_report["ms"]["default"], kernel_report["ms"][kernel]
    ms["float32"] = {n: round(t * fast[n] / default[n], 2) for n, t in ms["float32"].items()}
    report = decide_dtype(dtype_report, ms, plain)
    return {**report, "reason": f"{report['reason']}; float32 at the {kernel} kernel's speed"}


def _reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
    parts = ", ".join(f"{k}: t(1) {v['1']:.0f} ms, t(8) {v['8']:.0f} ms" for k, v in ms.items())
    return f"fp32 projections on the {chosen} kernel, the faster here ({parts}; measured once, cached)"
