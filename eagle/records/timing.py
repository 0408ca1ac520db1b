"""Timing that survives a shared machine: jobs measured round-robin, median per job."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Hashable, TypeVar

import torch
from tqdm import tqdm

K = TypeVar("K", bound=Hashable)


def time_interleaved(jobs: dict[K, Callable[[], None]], repeats: int, desc: str) -> dict[K, float]:
    """Median seconds per job. Jobs run round-robin (one warm-up pass first), so load that drifts
    during the measurement hits every job alike instead of biasing the later ones."""
    times: dict[K, list[float]] = {name: [] for name in jobs}
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for r in tqdm(range(repeats + 1), desc=desc, unit="pass", leave=False):
        for name, job in jobs.items():
            sync()
            t0 = time.perf_counter()
            job()
            sync()
            if r > 0:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


STALE_RATIO = 1.5  # a cached timing this much slower than a fresh probe was measured under load


def measured_under_load(cached_s: float, fresh_s: float) -> bool:
    """True when a cached timing is much slower than this machine is now: it was timed while other work
    shared the cores, so the choice made from it is wrong. The opposite (slower now) keeps the cache: the
    least loaded measurement is the better reference."""
    return cached_s > STALE_RATIO * fresh_s


class PhaseClock:
    """Splits one decoding round into named, disjoint phases: `lap(name)` charges the time since the
    previous lap to `name`, so the phases of a round sum to its wall time.

    On a CPU every torch op has finished when it returns, so a lap needs no synchronisation. On CUDA a
    lap waits for the device only when `sync` is set (profiling): otherwise the round runs without host
    syncs and only the round's total is exact (the phases then show launch time, not device time)."""

    def __init__(self, device: torch.device, sync: bool = False) -> None:
        self._sync = torch.cuda.synchronize if (sync and device.type == "cuda") else None
        self._last = 0.0
        self.laps: dict[str, float] = {}

    def start(self) -> "PhaseClock":
        self.laps = {}
        self._last = self._now()
        return self

    def lap(self, name: str) -> None:
        now = self._now()
        self.laps[name] = self.laps.get(name, 0.0) + now - self._last
        self._last = now

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()


# A round's phases in order (draft sums draft.0 .. draft.d); the prefill is step 0's only phase.
STEP_PHASES = ("prefill", "draft", "tree", "verify", "accept", "commit", "consume", "record")


def phase_seconds(timings: dict[str, float], phase: str) -> float:
    """A phase's seconds in a step's timings: `draft` sums its per-step laps `draft.0`, `draft.1`, ...
    (older traces hold a single `draft`); NaN when the step has no such phase."""
    found = [s for name, s in timings.items() if name == phase or name.startswith(phase + ".")]
    return sum(found) if found else float("nan")
