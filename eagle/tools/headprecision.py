"""The draft head's own precision (--head-dtype). The head is one decoder layer plus a product as wide as
its vocabulary, so its fastest precision need not be the target's: an fp32 target (the exact reference,
or a CPU without fast bf16 matmuls for the target's shapes) may verify beside a bf16 head. Greedy output
stays the target's whatever the head's precision: the target verifies every token.

"int8" drafts in bf16 on int8 weights (one scale per row: kernels.Int8Linear), half the bytes a bf16 head
reads after every verify. "auto" on a CPU times a round's drafting, right after a target forward as in a
round, in fp32, bf16 and (where torch's int8 kernel runs) int8 once per machine (cached, as the target's
--dtype auto is) and keeps the fastest; on CUDA it is the target's precision. "target" follows the target;
a dtype name is taken as given. A head follows the target onto its fast kernel (kernels.pack_beside)."""
from __future__ import annotations

from ..models.head import AnyHead, head_shape
from ..models.kernels import INT8, fast_kernels_tag, int8_available, kernel_tag, set_head_precision
from ..models.precision import CPU_DTYPES, DTYPES, cached_choice, dtype_name, machine_key
from ..models.target import Target
from .budget.costs import time_head_dtypes

HEAD_DTYPE_CHOICES = ("auto", "target", *DTYPES, INT8)
HEAD_PROBE_VERSION = 2  # bump when time_head_dtypes times something else: cached choices are then measured again


def auto_options() -> tuple[str, ...]:
    """What --head-dtype auto chooses between on a CPU: fp32, bf16, and int8 where its kernel runs."""
    return (*CPU_DTYPES, INT8) if int8_available() else CPU_DTYPES


def choose_head_dtype(target: Target, head: AnyHead, refresh: bool = False) -> dict:
    """The fastest of auto_options() for this head's drafting on this CPU, cached per target, head shape
    and machine: {"chosen", "ms": {precision: {"draft": ms}}, "reason", "file"}."""
    beside = f"|{fast_kernels_tag()}" if kernel_tag(target) else ""  # the kernels pack_beside gives each copy
    options = auto_options()
    key = f"head|{target.name}|{head_shape(head)}{kernel_tag(target)}{beside}|{'/'.join(options)}|" \
          f"probe{HEAD_PROBE_VERSION}|{machine_key(target.device)}"
    return cached_choice(key, lambda: time_head_dtypes(target, head, options), _reason, refresh, options)


def _reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
    parts = ", ".join(f"{d}: {v['draft']:.1f} ms" for d, v in ms.items())
    return f"{chosen} drafts faster on this CPU ({parts} per draft round; measured once, cached)"


def set_head_dtype(target: Target, head: AnyHead, choice: str = "auto", remeasure: bool = False) -> str | None:
    """Cast `head` (in place) to the precision `choice` names (HEAD_DTYPE_CHOICES); returns the
    sentence saying how auto chose it on a CPU, else None. `remeasure`: time auto's choice again."""
    if choice not in HEAD_DTYPE_CHOICES:
        raise ValueError(f"unknown head dtype {choice!r}: choose from {', '.join(HEAD_DTYPE_CHOICES)}")
    if choice == INT8 and (target.device.type != "cpu" or not int8_available()):
        where = "this machine" if target.device.type == "cpu" else f"a {target.device.type} device"
        raise ValueError(f"--head-dtype int8 needs torch's int8 weight-only CPU kernel, which {where} does not run: "
                         "use bfloat16 or auto")
    report = None
    if choice == "auto" and target.device.type == "cpu":
        report = choose_head_dtype(target, head, remeasure)
        precision = report["chosen"]
    else:
        precision = choice if choice in (*DTYPES, INT8) else dtype_name(target.dtype)
    set_head_precision(target, head, precision)
    return None if report is None else report["reason"]
