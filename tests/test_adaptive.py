"""Adaptive per-round tree size: the pure choice against brute force, its limits, the cost
interpolation, and greedy equality on the real model when every round picks its own size."""
from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle.core.adaptive import RoundCosts, best_tree_size
from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.core.prompt import encode_prompt


def _rate(values: list[float], costs: RoundCosts, n: int) -> float:
    return (1 + costs.alpha * sum(values[:n - 1])) / (costs.verify[n - 1] + costs.fixed)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0, 1), max_size=20),
       verify=st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=24),
       fixed=st.floats(0, 0.5), alpha=st.floats(0, 2))
def test_best_size_is_the_brute_force_optimum(values, verify, fixed, alpha) -> None:
    values = sorted(values, reverse=True)
    costs = RoundCosts(tuple(verify), fixed, alpha)
    n = best_tree_size(torch.tensor(values, dtype=torch.float64), costs)
    sizes = range(1, min(len(values), len(verify) - 1) + 2)
    assert n in sizes
    assert _rate(values, costs, n) >= max(_rate(values, costs, m) for m in sizes) * (1 - 1e-12)


def test_limits_certain_and_hopeless_rounds() -> None:
    flat = RoundCosts((0.05,) * 16, 0.01, 1.0)
    assert best_tree_size(torch.ones(30), flat) == 16  # free verification, sure acceptance: all of it
    assert best_tree_size(torch.zeros(30), flat) == 1  # nothing will be accepted: verify the root only
    steep = RoundCosts(tuple(0.04 + 0.04 * i for i in range(16)), 0.0, 1.0)
    assert best_tree_size(torch.full((30,), 0.3), steep) == 1  # each node costs more than it returns


def test_interpolated_costs() -> None:
    costs = RoundCosts.interpolate({1: 0.04, 4: 0.07, 8: 0.08}, 0.01, 0.9, 10)
    assert len(costs.verify) == 10
    assert costs.verify[0] == pytest.approx(0.04) and costs.verify[3] == pytest.approx(0.07)
    assert costs.verify[1] == pytest.approx(0.05) and costs.verify[5] == pytest.approx(0.075)
    assert costs.verify[9] == pytest.approx(0.085)  # the last segment extended
    with pytest.raises(ValueError):
        RoundCosts((), 0.0, 1.0)
    by_context = {192: {1: 0.04, 8: 0.08}, 1024: {1: 0.06, 8: 0.12}}
    long = RoundCosts.interpolate({1: 0.04, 8: 0.08}, 0.01, 0.9, 8, by_context)
    assert long.verify_at(None) == long.verify and long.verify_at(192) == pytest.approx(long.verify)
    assert long.verify_at(608)[0] == pytest.approx(0.05) and long.verify_at(1024)[7] == pytest.approx(0.12)
    assert long.verify_at(1856)[7] == pytest.approx(0.16)  # extended past the longest measured context
    # A longer context makes each verified token dearer relative to what it returns: the tree shrinks.
    values = torch.full((7,), 0.35, dtype=torch.float64)
    steep = RoundCosts.interpolate({1: 0.04, 8: 0.05}, 0.0, 1.0, 8, {192: {1: 0.04, 8: 0.05}, 2048: {1: 0.05, 8: 0.2}})
    assert best_tree_size(values, steep, 192) == 8 and best_tree_size(values, steep, 2048) < 8


@pytest.mark.slow
def test_adaptive_rounds_stay_lossless(target, trained_head, mt_prompts) -> None:
    """A cost table that makes sizes vary from round to round; greedy output must not change."""
    costs = RoundCosts(tuple(0.04 + 0.004 * n for n in range(16)), 0.01, 1.0)
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=48, total_tokens=16, depth=4, top_k=4)
    for q in mt_prompts[:2]:
        ids = encode_prompt(target.tokenizer, q["turns"][0], target.max_context)
        ref = generate(Decoder(target, None, cfg.with_(mode="vanilla")), ids)
        got = generate(Decoder(target, trained_head, cfg, costs), ids)
        assert got.tokens == ref.tokens
        sizes = {sum(n.kept for n in s.nodes) for s in got.steps[1:-1]}  # the root counts as kept
        assert len(sizes) > 1 and max(sizes) <= 16
    with pytest.raises(ValueError, match="dynamic"):
        Decoder(target, trained_head, cfg.with_(mode="static"), costs)
