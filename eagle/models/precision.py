"""Device and precision: the device and dtype names a user gives, checked before any model loads, the
precisions worth a baseline, and "auto" on a CPU: the faster of fp32 and bf16 for this model, measured
once per machine and cached."""
from __future__ import annotations

import copy
import hashlib
import os
import platform
from pathlib import Path
from typing import Callable

import torch

from ..records.files import atomic_write_json, read_json_or_none
from ..records.timing import measured_under_load, time_interleaved
from .location import cache_dir
from .target import Target

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
DtypeSpec = str | torch.dtype | None  # a name of DTYPE_CHOICES, a torch dtype, or None (the reference)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_device(device: str | torch.device | None) -> torch.device:
    """The device to run on (CUDA when present), checked before any model is loaded."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}: use cpu or cuda (cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported: use cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but this machine has no CUDA GPU: use cpu")
    return dev


def parse_dtype(dtype: DtypeSpec, device: torch.device) -> torch.dtype | None:
    """A torch dtype, or None for "auto on a CPU" (decided by a measurement at load time).

    None (the library default) is fp32 on a CPU, the exact reference the token-for-token tests run
    in, and bf16 on CUDA (fp16 on GPUs without bf16). "auto" is the same on CUDA and the faster of
    fp32 and bf16, measured on this machine, on a CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in (None, *DTYPE_CHOICES):
        raise ValueError(f"unknown dtype {dtype!r}: choose from {', '.join(DTYPE_CHOICES)}")
    if dtype in DTYPES:
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None if dtype == "auto" else torch.float32


def runnable_dtypes(device: torch.device) -> tuple[str, ...]:
    """The precisions worth timing a baseline in on this device: fp32 always; on a CPU bf16 too (fast
    with AVX512_BF16 or AMX, emulated otherwise: then simply slower); on CUDA bf16 or, without it, fp16."""
    if device.type == "cuda":
        return ("float32", "bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    return ("float32", "bfloat16")


# ---- "auto" precision on a CPU ------------------------------------------------------------------
DTYPE_PROBE_NS = (1, 8)  # a plain decoding step and a typical small verify tree
DTYPE_PREFIX = 192
CPU_DTYPES = ("float32", "bfloat16")  # what "auto" chooses between on a CPU (fp16 matmuls are slow there)


def forward_job(target: Target, n_new: int, prefix: int = DTYPE_PREFIX) -> Callable[[], None]:
    """One n_new-token forward after a `prefix`-token prefix, rewriting the same cache slots."""
    cache = target.new_cache(prefix + n_new)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (1, prefix + n_new), generator=gen)
    ids = ids.to(target.device)
    target.forward(ids[:, :prefix], torch.arange(prefix, device=target.device)[None], cache, 0,
                   logits_rows=slice(-1, None))
    pos = torch.arange(prefix, prefix + n_new, device=target.device)[None]
    return lambda: target.forward(ids[:, prefix:], pos, cache, prefix)


CHECK_PREFIX = 8  # the load-time check's prefix: short, so it costs ~4 one-token forwards (the cached t(1)
# after 192 tokens differs from it by a few per cent, far inside STALE_RATIO)


def one_token_seconds(target: Target) -> float:
    """A quick timing of the target's one-token forward as it is now (~4 forwards)."""
    with torch.inference_mode():
        return time_interleaved({"t1": forward_job(target, 1, CHECK_PREFIX)}, 3, "check the precision cache")["t1"]


def timed_under_load(report: dict, target: Target) -> bool:
    """True when `report`, a precision choice read from the cache (not measured just now), timed this
    target's one-token forward (its dtype, torch's default kernel) much slower than it runs now: it was
    measured while other work shared the cores (a setup beside a long job), and its choice may be wrong."""
    cached = report["ms"].get(dtype_name(target.dtype), {}).get("1")
    if report.get("measured") or cached is None:
        return False
    return measured_under_load(cached / 1000, one_token_seconds(target))


def measure_dtypes(target: Target, dtypes: tuple[str, ...] = CPU_DTYPES,
                   repeats: int = 15) -> dict[str, dict[int, float]]:
    """Median forward time per dtype and token count, all probes interleaved so a drift in the
    machine's load hits each alike. Works on copies: `target` is left as it is."""
    copies = {d: Target(copy.deepcopy(target.model).to(DTYPES[d]), target.tokenizer, target.name) for d in dtypes}
    jobs = {(d, n): forward_job(copies[d], n) for d in dtypes for n in DTYPE_PROBE_NS}
    times = time_interleaved(jobs, repeats, desc=f"timing {' vs '.join(dtypes)} once for --dtype auto")
    return {d: {n: times[(d, n)] for n in DTYPE_PROBE_NS} for d in dtypes}


def choose_cpu_dtype(target: Target, refresh: bool = False, plain: bool = False) -> dict:
    """The faster of fp32 and bf16 for this model on this CPU, cached per model, CPU and thread count:
    for decoding with trees the least t(1) + t(8) (a draft round and a verify), for plain decoding
    (`plain`: one token per forward) the least t(1). Returns {"chosen", "ms": {dtype: {n: ms}}, "reason",
    "file"}."""
    def measure() -> dict[str, dict[str, float]]:
        measured = measure_dtypes(target)
        return {d: {str(n): round(1000 * t, 2) for n, t in by_n.items()} for d, by_n in measured.items()}
    report = cached_choice(f"{target.name}|{machine_key(target.device)}", measure, _dtype_reason, refresh)
    return decide_dtype(report, report["ms"], plain)


def decide_dtype(report: dict, ms: dict[str, dict[str, float]], plain: bool) -> dict:
    """`report` with the precision its timings `ms` choose: for trees the least t(1) + t(8), for plain
    decoding the least t(1), and the sentence saying so."""
    if plain:
        chosen = min(ms, key=lambda d: ms[d]["1"])
        return {**report, "ms": ms, "chosen": chosen, "reason": _plain_reason(chosen, ms)}
    chosen = min(ms, key=lambda d: sum(ms[d].values()))
    return {**report, "ms": ms, "chosen": chosen, "reason": _dtype_reason(chosen, ms)}


def _plain_reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
    parts = ", ".join(f"{d}: t(1) {v['1']:.0f} ms" for d, v in ms.items())
    return f"{chosen} decodes one token at a time faster on this CPU ({parts}; measured once, cached)"


def machine_key(device: torch.device) -> str:
    """What a measured precision choice holds for: the device, the thread count and torch."""
    return f"{device_name(device)}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def cached_choice(key: str, measure: Callable[[], dict[str, dict[str, float]]],
                  reason: Callable[[str, dict[str, dict[str, float]]], str], refresh: bool = False,
                  options: tuple[str, ...] = CPU_DTYPES) -> dict:
    """The option (a precision, a kernel) with the least summed milliseconds (measure(): {option:
    {probe: ms}}), measured once per key and cached. Returns {"key", "chosen", "ms", "reason", "file"}."""
    path = cache_dir() / "precision" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    report = None if refresh else _cached_dtype_choice(path, key, options)
    if report is None:
        ms = measure()
        chosen = min(ms, key=lambda d: sum(ms[d].values()))
        report = {"key": key, "chosen": chosen, "ms": ms, "reason": reason(chosen, ms)}
        atomic_write_json(path, report)
        return {**report, "file": str(path), "measured": True}  # just now: no check against the machine needed
    return {**report, "file": str(path)}


def _cached_dtype_choice(path: Path, key: str, options: tuple[str, ...] = CPU_DTYPES) -> dict | None:
    """The cached report when it is for this key and whole; a choice outside `options` or a reason that
    is no text (an edit, another version's format) makes it stale, to be measured again."""
    report = read_json_or_none(path)
    if report is None or report.get("key") != key or report.get("chosen") not in options:
        return None
    return report if isinstance(report.get("reason"), str) else None


def _dtype_reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
    parts = ", ".join(f"{d}: t(1) {v['1']:.0f} ms, t(8) {v['8']:.0f} ms" for d, v in ms.items())
    return f"{chosen} is faster on this CPU ({parts}; measured once, cached)"


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model and core count: part of every cache key for measured costs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        model = None
    return f"cpu:{model or platform.processor() or platform.machine()}:{os.cpu_count()}"
