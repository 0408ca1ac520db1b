"""Adaptive per-round tree size: verify as many drafted nodes as pay for themselves *this* round.

EAGLE-2 reranks the drafted candidates by path value (the product of draft probabilities along the
path) and verifies a fixed number of them. Path values are calibrated acceptance estimates, so the
expected tokens of a round that verifies the n - 1 best candidates is 1 + alpha * (sum of their
values), with alpha fitted on recorded rounds. Against the verify cost measured on this machine for
n tokens, the round's expected rate is

    rate(n) = (1 + alpha * sum of the n - 1 best values) / (t_verify(n) + t_fixed)

where t_fixed is what the round has already spent drafting (plus per-round overhead). A confident
round (a repeated phrase, a code idiom) widens the tree; an uncertain one shrinks it, down to a
single-token verify. The choice is a pure function of the sorted values and the cost table.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RoundCosts:
    """Measured seconds per round on this machine, and the value calibration."""

    verify: tuple[float, ...]  # verify[n - 1]: one target pass over n tree tokens, n = 1..len(verify)
    fixed: float  # drafting + per-round overhead, paid whatever size is verified
    alpha: float  # E[accepted drafts] = alpha * sum of the verified candidates' path values

    def __post_init__(self) -> None:
        if not self.verify or min(self.verify) <= 0 or self.fixed < 0 or self.alpha < 0:
            raise ValueError("round costs need positive verify times, fixed >= 0 and alpha >= 0")

    @classmethod
    def interpolate(cls, measured: dict[int, float], fixed: float, alpha: float, max_n: int) -> "RoundCosts":
        """Fill 1..max_n from costs measured at a few sizes (linear between them, flat past the end)."""
        ns = sorted(measured)
        xs, ys = torch.tensor(ns, dtype=torch.float64), torch.tensor([measured[n] for n in ns], dtype=torch.float64)
        grid = torch.arange(1, max_n + 1, dtype=torch.float64)
        right = torch.searchsorted(xs, grid).clamp(1, len(ns) - 1)
        x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
        t = ((grid - x0) / (x1 - x0)).clamp(0, 1) if len(ns) > 1 else torch.zeros_like(grid)
        values = y0 + t * (y1 - y0) if len(ns) > 1 else ys.expand_as(grid)
        return cls(tuple(values.tolist()), fixed, alpha)


def best_tree_size(values_desc: torch.Tensor, costs: RoundCosts) -> int:
    """The tree size n (root included) with the highest expected tokens per second, given the
    candidates' path values in descending order; n - 1 never exceeds the candidates or the table."""
    m = min(values_desc.numel(), len(costs.verify) - 1)
    gains = torch.cumsum(values_desc[:m].double().cpu(), 0) * costs.alpha
    expected = torch.cat([torch.zeros(1, dtype=torch.float64), gains]) + 1  # n = 1..m+1
    seconds = torch.tensor(costs.verify[:m + 1], dtype=torch.float64) + costs.fixed
    return int(torch.argmax(expected / seconds)) + 1
