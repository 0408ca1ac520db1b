"""The draft head's own precision (--head-dtype). The head is one decoder layer plus a product as wide as
its vocabulary, so its fastest precision need not be the target's: an fp32 target (the exact reference,
or a CPU without fast bf16 matmuls for the target's shapes) may verify beside a bf16 head. Greedy output
stays the target's whatever the head's precision: the target verifies every token.

"auto" on a CPU times a round's drafting in fp32 and bf16 once per machine (cached, as the target's
--dtype auto is) and keeps the faster; on CUDA it is the target's precision. "target" follows the
target; a dtype name is taken as given. An fp32 head follows the target's fp32 kernel (kernels.pack_beside)."""
from __future__ import annotations

from ..models.head import AnyHead, cast_head, head_dtype, head_shape
from ..models.kernels import fast_kernels_tag, kernel_tag, pack_beside
from ..models.precision import CPU_DTYPES, DTYPES, cached_choice, machine_key
from ..models.target import Target
from .budget.costs import time_head_dtypes

HEAD_DTYPE_CHOICES = ("auto", "target", *DTYPES)


def choose_head_dtype(target: Target, head: AnyHead, refresh: bool = False) -> dict:
    """The faster of fp32 and bf16 for this head's drafting on this CPU, cached per target, head shape
    and machine: {"chosen", "ms": {dtype: {"draft": ms}}, "reason", "file"}."""
    beside = f"|{fast_kernels_tag()}" if kernel_tag(target) else ""  # the kernels pack_beside gives each copy
    key = f"head|{target.name}|{head_shape(head)}{kernel_tag(target)}{beside}|{machine_key(target.device)}"
    return cached_choice(key, lambda: time_head_dtypes(target, head, CPU_DTYPES), _reason, refresh)


def _reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
    parts = ", ".join(f"{d}: {v['draft']:.1f} ms" for d, v in ms.items())
    return f"{chosen} drafts faster on this CPU ({parts} per draft round; measured once, cached)"


def set_head_dtype(target: Target, head: AnyHead, choice: str = "auto", remeasure: bool = False) -> str | None:
    """Cast `head` (in place) to the precision `choice` names (HEAD_DTYPE_CHOICES); returns the
    sentence saying how auto chose it on a CPU, else None. `remeasure`: time auto's choice again."""
    if choice not in HEAD_DTYPE_CHOICES:
        raise ValueError(f"unknown head dtype {choice!r}: choose from {', '.join(HEAD_DTYPE_CHOICES)}")
    report = None
    if choice == "auto" and target.device.type == "cpu":
        report = choose_head_dtype(target, head, remeasure)
        dtype = DTYPES[report["chosen"]]
    else:
        dtype = DTYPES[choice] if choice in DTYPES else target.dtype
    if dtype != head_dtype(head):
        cast_head(head, dtype, target.model.model.embed_tokens)
    pack_beside(target, head)  # an fp32 head runs the target's fp32 kernel
    return None if report is None else report["reason"]
