"""Greedy losslessness at reduced precision: where two greedy outputs part, and whether at a near-tie.

In fp32 greedy speculative decoding reproduces vanilla greedy token for token (the tests assert it).
In bf16 a tree verify and a one-token step run matrix products of different shapes, so their
roundings differ and a near-tie between the target's two best tokens can flip. That is not a bug of
the algorithm; a divergence where the target's choice was clear is. `logit_gap_at` measures the
margin at the first divergence, and `NEAR_TIE_LOGIT_GAP` is the bound below which a flip is allowed.
"""
from __future__ import annotations

import math

import torch

from ..models.target import Target

# Measured on SmolLM2-135M-Instruct in bf16 (8 MT-bench prompts x 41 greedy positions, 2026-12-03):
# the top-2 logit gap of a one-token forward and of the same position inside an 8-token causal
# forward differ by median 0.06, 95th percentile 0.25, max 0.375 logits. Logits there are 16-31,
# where bf16's spacing is 0.125, so a gap is resolved only to ~0.25. A flip needs a gap below that
# shape noise; 0.5 (four bf16 ulps at this scale, above every change measured) is the bound. Larger
# logits have a coarser spacing (0.25 from 32 to 64: measured 2026-12-06, head v6 with the prompt-lookup
# branch, MT-bench q122: a flip at 43.0 vs 42.5, two ulps there, with fp32 reproducing vanilla exactly),
# so the bound is four ulps at the top logit's magnitude, never below 0.5.
NEAR_TIE_LOGIT_GAP = 0.5
ULPS = 4


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where the token lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_at(target: Target, prompt_ids: list[int], reference: list[int], position: int) -> tuple[list[int], float]:
    """The target's two best tokens for new token `position` of the greedy `reference` continuation
    and their logit gap (top-1 minus top-2), as vanilla decoding computes them."""
    top = _top2(target, prompt_ids, reference, position)
    return [int(i) for i in top.indices], float(top.values[0] - top.values[1])


def _top2(target: Target, prompt_ids: list[int], reference: list[int], position: int):
    """torch.topk's (values, indices) of vanilla's two best tokens at new token `position`."""
    return logits_at(target, prompt_ids, reference, position).topk(2)


def choice_gap_at(target: Target, prompt_ids: list[int], reference: list[int], position: int, token: int) -> float:
    """How far below vanilla's choice the target put `token` (the one another decoder took there): the
    logit of reference[position] minus token's. In a three-way bf16 tie the runner-up can be a third token."""
    logits = logits_at(target, prompt_ids, reference, position)
    return float(logits[reference[position]] - logits[token])


@torch.inference_mode()
def logits_at(target: Target, prompt_ids: list[int], reference: list[int], position: int) -> torch.Tensor:
    """The target's fp32 logits (V,) for new token `position` of `reference`: the prefix as one forward,
    then the last token alone, as vanilla decoding runs it."""
    seq = list(prompt_ids) + list(reference[:position])
    dev = target.device
    cache = target.new_cache(len(seq) + 1)
    ids = torch.tensor([seq], device=dev)
    if len(seq) > 1:
        target.forward(ids[:, :-1], torch.arange(len(seq) - 1, device=dev)[None], cache, 0, logits_rows=slice(0, 0))
    logits, _ = target.forward(ids[:, -1:], torch.tensor([[len(seq) - 1]], device=dev), cache, len(seq) - 1)
    return logits[0, -1].float()


def logit_gap_at(target: Target, prompt_ids: list[int], reference: list[int], position: int) -> float:
    """The top-2 logit gap of `top2_at`: the margin vanilla had where another decoder parted from it."""
    return top2_at(target, prompt_ids, reference, position)[1]


def gap_and_top_at(target: Target, prompt_ids: list[int], reference: list[int], position: int) -> tuple[float, float]:
    """(top-2 logit gap, top logit) where another decoder parted from vanilla: is_precision_flip's inputs."""
    top = _top2(target, prompt_ids, reference, position).values
    return float(top[0] - top[1]), float(top[0])


def near_tie_bound(dtype: torch.dtype, top_logit: float = 0.0) -> float:
    """The largest top-2 gap a rounding difference can flip at this precision and logit magnitude."""
    if dtype == torch.float32:
        return 0.0
    spacing = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(top_logit))) if top_logit else 0.0
    return max(NEAR_TIE_LOGIT_GAP, ULPS * spacing)


def is_precision_flip(dtype: torch.dtype, gap: float, top_logit: float = 0.0) -> bool:
    """A divergence is tolerated only below fp32 and only at a near-tie (near_tie_bound)."""
    return dtype != torch.float32 and gap < near_tie_bound(dtype, top_logit)
