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
from .precision import DTYPE_PROBE_NS, forward_job, cached_choice, machine_key
from .target import Target

KERNELS = ("default", "onednn")


class PackedLinear(nn.Linear):
    """An fp32 nn.Linear whose forward runs oneDNN on a prepacked copy of its weight; `weight` stays the
    same Parameter (a tied embedding, the draft head's scoring rows and weight hashes read it)."""

    @classmethod
    def of(cls, linear: nn.Linear, rows_hint: int = 8) -> "PackedLinear":
        packed = cls.__new__(cls)
        nn.Module.__init__(packed)
        packed.in_features, packed.out_features = linear.in_features, linear.out_features
        packed.weight, packed.bias = linear.weight, linear.bias
        # the layout is chosen for rows_hint rows; any row count runs on it
        packed.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (..., in) -> (rows, in)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack_linears(model: nn.Module) -> int:
    """Every fp32 CPU nn.Linear under `model` as a PackedLinear, in place; returns how many."""
    count = 0
    for name, child in model.named_children():
        if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
            setattr(model, name, PackedLinear.of(child))
            count += 1
        else:
            count += pack_linears(child)
    return count


def linear_kernel(target: Target) -> str:
    """Which kernel the target's projections run on: "onednn" once packed, else "default"."""
    return "onednn" if isinstance(target.model.lm_head, PackedLinear) else "default"


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


def _reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
    parts = ", ".join(f"{k}: t(1) {v['1']:.0f} ms, t(8) {v['8']:.0f} ms" for k, v in ms.items())
    return f"fp32 projections on the {chosen} kernel, the faster here ({parts}; measured once, cached)"
