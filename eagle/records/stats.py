"""The arithmetic behind every reported rate, in one place: the decoder's Generation, the bench, the
Spec-Bench export, the analysis tables, the notebook and the dashboard all call these.

tau               new tokens / target forward passes. The prefill is one forward that yields one
                  token, so it counts on both sides: vanilla decoding has tau 1 exactly, and HF
                  generate (one forward per token; prompt lookup fewer) is measured the same way.
tokens/s          new tokens / wall-clock seconds of the generation, from the start of the prefill to
                  the last token (what `generate` and the bench time). Over several generations: their
                  total tokens over their total seconds, so a long answer weighs by its length; not the
                  mean of per-generation rates.
speed-up          a rate over a reference rate measured the same way (the bench: vanilla at the same
                  dtype, run interleaved with it).
mean rate         Spec-Bench's statistic (its evaluation/speed.py): the mean over questions of each
                  question's tokens/s; its speed-up is a ratio of two such means. Reported beside ours,
                  never instead of it.

Empty input gives NaN (no forwards, no seconds, no reference, no values), never 0: a 0 would read as
a measured rate.
"""
from __future__ import annotations

import math
from typing import Iterable

NAN = math.nan


def tau(new_tokens: float, target_forwards: float) -> float:
    """New tokens per target forward pass (prefill included on both sides); NaN without a forward."""
    return new_tokens / target_forwards if target_forwards > 0 else NAN


def tokens_per_second(new_tokens: float, seconds: float) -> float:
    """New tokens over their seconds; NaN without positive time (nothing was timed)."""
    return new_tokens / seconds if seconds > 0 else NAN


def speedup(rate: float, reference: float) -> float:
    """rate / reference; NaN when the reference is missing, zero or NaN."""
    return rate / reference if reference > 0 else NAN  # NaN > 0 is False


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean; NaN for no values."""
    values = list(values)
    return sum(values) / len(values) if values else NAN


def mean_rate(runs: Iterable[tuple[float, float]]) -> float:
    """Spec-Bench's mean speed: the mean over (tokens, seconds) runs of tokens/s, leaving out runs
    with no time (as its script does); NaN when none is left."""
    return mean(r for r in (tokens_per_second(n, s) for n, s in runs) if not math.isnan(r))


Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval


def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a rate successes / n (95 % by default): unlike the normal
    approximation it stays inside [0, 1] and is not zero-width at a rate of 0 or 1 from a few trials,
    which is where the draft's per-bin and per-position rates live. (NaN, NaN) for n = 0."""
    if n <= 0:
        return NAN, NAN
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
