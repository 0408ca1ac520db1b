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
