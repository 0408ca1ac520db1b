"""Adaptive per-round tree size: verify as many drafted nodes as pay for themselves *this* round.

EAGLE-2 reranks the drafted candidates by path value (the product of draft probabilities along the
path) and verifies a fixed number of them. Path values are calibrated acceptance estimates, so the
expected tokens of a round that verifies the n - 1 best candidates is 1 + alpha * (sum of their
values), with alpha fitted on recorded rounds. Against the verify cost measured on this machine for
n tokens, the round's expected rate is

    rate(n) = (1 + alpha * sum of the n - 1 best values) / (t_verify(n) + t_fixed)

where t_fixed is what the round has already spent drafting (plus per-round overhead) and t_verify is
taken at the round's context length (attention grows with it). A confident
round (a repeated phrase, a code idiom) widens the tree; an uncertain one shrinks it, down to a
single-token verify. The choice is a pure function of the sorted values and the cost table.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through measured (x, y) points, extended linearly past either end: the one
    cost interpolation of the project (verify cost against tree size, and against context length,
    both grow about linearly past the measured range)."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    right = next((i for i, v in enumerate(xs) if v >= x), len(xs) - 1)
    i = min(max(right, 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class RoundCosts:
    """Measured seconds per round on this machine, and the value calibration."""

    verify: tuple[float, ...]  # verify[n - 1]: one target pass over n tree tokens, n = 1..len(verify)
    fixed: float  # drafting + per-round overhead, paid whatever size is verified
    alpha: float  # E[accepted drafts] = alpha * sum of the verified candidates' path values
    # Optional: the same table at several context lengths (verify is then the one at contexts[0]).
    contexts: tuple[int, ...] = ()
    verify_by_context: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.verify or min(self.verify) <= 0 or self.fixed < 0 or self.alpha < 0:
            raise ValueError("round costs need positive verify times, fixed >= 0 and alpha >= 0")
        if len(self.contexts) != len(self.verify_by_context) or \
                any(len(row) != len(self.verify) for row in self.verify_by_context):
            raise ValueError("one verify table of the same length per context")

    @classmethod
    def interpolate(cls, measured: dict[int, float], fixed: float, alpha: float, max_n: int,
                    by_context: dict[int, dict[int, float]] | None = None) -> "RoundCosts":
        """Fill sizes 1..max_n from costs measured at a few sizes (and, optionally, at a few context
        lengths: by_context maps a context length to its measured sizes)."""
        def table(points: dict[int, float]) -> tuple[float, ...]:
            return tuple(interpolate(points, n) for n in range(1, max_n + 1))
        contexts = tuple(sorted(by_context or {}))
        return cls(table(measured), fixed, alpha, contexts, tuple(table(by_context[c]) for c in contexts))

    def verify_at(self, context: int | None) -> tuple[float, ...]:
        """The verify table at a context length (interpolated between the measured ones)."""
        if context is None or len(self.contexts) < 2:
            return self.verify
        return tuple(max(1e-6, interpolate(dict(zip(self.contexts, col)), context))
                     for col in zip(*self.verify_by_context))

    def to_json(self) -> dict:
        """Lists, not tuples: the dict equals its JSON round trip (bench compares it on resume)."""
        return {"verify": list(self.verify), "fixed": self.fixed, "alpha": self.alpha, "contexts": list(self.contexts),
                "verify_by_context": [list(row) for row in self.verify_by_context]}


def best_tree_size(values_desc: torch.Tensor, costs: RoundCosts, context: int | None = None) -> int:
    """The tree size n (root included) with the highest expected tokens per second, given the
    candidates' path values in descending order and the current context length; n - 1 never
    exceeds the candidates or the table. A few dozen host floats: Python arithmetic (in float64, as
    the values are summed in order), not a dozen small tensor ops a round; the first best on a tie."""
    verify = costs.verify_at(context)
    values = values_desc.tolist()[:len(verify) - 1]
    best, best_rate, gain = 1, 1 / (verify[0] + costs.fixed), 0.0
    for n, value in enumerate(values, start=2):
        gain += value
        rate = (gain * costs.alpha + 1) / (verify[n - 1] + costs.fixed)
        if rate > best_rate:
            best, best_rate = n, rate
    return best
