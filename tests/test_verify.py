"""Acceptance rules of eagle.core.verify: greedy exactness and lossless sampling (chi-square)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from eagle.core.decode import greedy_accept
from eagle.core.tree import Tree, build_tree, static_paths_to_tree_shape
from eagle.core.verify import (
    accept_greedy,
    accept_sampling_dynamic,
    accept_sampling_static,
    process_logits,
    row_argmax,
    sample_children_without_replacement,
)

V = 6
TRIALS = 4000
P_MIN = 1e-3
# (temperature, top_p, top_k) of the target's processed distribution.
SAMPLING = [(1.0, 1.0, 0), (0.7, 0.8, 0)]


# ---------------------------------------------------------------- process_logits

def _reference_process(row: np.ndarray, temperature: float, top_p: float, top_k: int) -> np.ndarray:
    z = row / temperature
    if 0 < top_k < len(z):
        z = np.where(z < np.sort(z)[::-1][top_k - 1], -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1:
        keep, mass = np.zeros(len(p), dtype=bool), 0.0
        for i in np.argsort(-p, kind="stable"):
            if mass >= top_p:
                break
            keep[i], mass = True, mass + p[i]
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.3, 0.7, 1.0, 2.0]),
       st.sampled_from([0.1, 0.5, 0.8, 0.95, 1.0]), st.sampled_from([0, 1, 3, 8, 20]))
def test_process_logits_matches_reference(seed: int, temperature: float, top_p: float,
                                          top_k: int) -> None:
    logits = np.random.default_rng(seed).normal(scale=2.0, size=(2, 3, 8))
    probs = process_logits(torch.from_numpy(logits), temperature, top_p, top_k)
    expected = np.stack([_reference_process(r, temperature, top_p, top_k)
                         for r in logits.reshape(-1, 8)]).reshape(logits.shape)
    np.testing.assert_allclose(probs.numpy(), expected, atol=1e-12)


def test_process_logits_top_k_keeps_ties() -> None:
    probs = process_logits(torch.tensor([2.0, 1.0, 1.0, 0.0]), 1.0, 1.0, 2)
    assert (probs > 0).tolist() == [True, True, True, False]


@pytest.mark.parametrize("temperature, top_p, top_k", [
    (0.0, 1.0, 0), (-1.0, 1.0, 0), (float("nan"), 1.0, 0), (float("inf"), 1.0, 0),
    (1.0, 0.0, 0), (1.0, 1.5, 0), (1.0, 1.0, -1), (1.0, 1.0, 1.5)])
def test_process_logits_validates(temperature: float, top_p: float, top_k) -> None:
    with pytest.raises(ValueError):
        process_logits(torch.zeros(4), temperature, top_p, top_k)


# ---------------------------------------------------------------- greedy

def _one_hot_logits(argmaxes: list[int], vocab: int = V) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), vocab)  # (N, V)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 1.0
    return logits


def test_greedy_hand_made_tree() -> None:
    # root(5) -> 1(2) -> 3(4); root -> 2(3) -> 4(1)
    tree = build_tree(torch.tensor([5, 2, 3, 4, 1]), torch.tensor([-1, 0, 0, 1, 2]))
    assert accept_greedy(tree, _one_hot_logits([3, 0, 1, 0, 0])) == ([0, 2, 4], 0)
    assert accept_greedy(tree, _one_hot_logits([2, 4, 1, 5, 0])) == ([0, 1, 3], 5)
    assert accept_greedy(tree, _one_hot_logits([3, 0, 2, 0, 0])) == ([0, 2], 2)
    assert accept_greedy(tree, _one_hot_logits([0, 4, 1, 5, 0])) == ([0], 0)  # no match
    root_only = build_tree(torch.tensor([5]), torch.tensor([-1]))
    assert accept_greedy(root_only, _one_hot_logits([4])) == ([0], 4)


@st.composite
def small_token_trees(draw) -> tuple[Tree, torch.Tensor]:
    n = draw(st.integers(1, 15))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    argmaxes = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return build_tree(torch.tensor(tokens), torch.tensor(parents)), _one_hot_logits(argmaxes, 3)


def _longest_greedy_depth(tree: Tree, greedy: list[int], node: int = 0) -> int:
    kids = [c for c in tree.children(node).tolist() if int(tree.tokens[c]) == greedy[node]]
    return max((1 + _longest_greedy_depth(tree, greedy, c) for c in kids), default=0)


@settings(max_examples=150, deadline=None)
@given(small_token_trees())
def test_greedy_matches_brute_force(case: tuple[Tree, torch.Tensor]) -> None:
    tree, logits = case
    greedy = logits.argmax(-1).tolist()
    accepted, bonus = accept_greedy(tree, logits)
    assert accepted[0] == 0
    assert all(int(tree.parents[c]) == p for p, c in zip(accepted, accepted[1:]))
    assert all(int(tree.tokens[c]) == greedy[p] for p, c in zip(accepted, accepted[1:]))
    assert len(accepted) - 1 == _longest_greedy_depth(tree, greedy)
    assert bonus == greedy[accepted[-1]]
    # between equal paths (equal sibling tokens), the one ending at the lowest node index
    ends = [i for i in range(tree.num_nodes) if _path_matches(tree, greedy, i) and int(tree.depths[i]) == len(accepted) - 1]
    assert accepted[-1] == min(ends)


def _path_matches(tree: Tree, greedy: list[int], node: int) -> bool:
    while node > 0:
        parent = int(tree.parents[node])
        if int(tree.tokens[node]) != greedy[parent]:
            return False
        node = parent
    return True


@settings(max_examples=100, deadline=None)
@given(small_token_trees(), st.integers(0, 2**31 - 1))
def test_the_decoders_greedy_acceptance_equals_argmax_and_softmax(case: tuple[Tree, torch.Tensor], seed: int) -> None:
    """greedy_accept (a two-pass argmax, then log_softmax) accepts exactly what accept_greedy does, ties
    included (small integer logits tie often: both take the lowest id), and its p(token | parent) is the softmax's."""
    tree, _ = case
    logits = torch.randint(-2, 3, (tree.num_nodes, 3), generator=torch.Generator().manual_seed(seed)).float()
    accepted, bonus, probs = greedy_accept(tree, logits)
    assert (accepted, bonus) == accept_greedy(tree, logits)
    parents = tree.parents.clamp(min=0)
    assert torch.allclose(probs, logits.softmax(-1)[parents, tree.tokens], atol=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.sampled_from([7, 128, 256, 1000, 1536, 4096, 4099]), st.integers(-3, 3),
       st.integers(0, 2**31 - 1), st.booleans())
def test_row_argmax_is_argmax_ties_and_nan_included(rows: int, vocab: int, spread: int, seed: int, nan: bool) -> None:
    """The two-pass argmax (block maxima, then inside the first block holding the maximum) is argmax's
    first maximum for every row: small integer scores tie across blocks, a NaN wins as in argmax, and a
    vocabulary with no block width (7, 4099: prime) takes the plain pass."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(-3, 4 + spread, (rows, vocab), generator=gen).float()
    if nan:
        scores.view(-1)[torch.randint(0, rows * vocab, (2,), generator=gen)] = float("nan")
    assert torch.equal(row_argmax(scores, block=256), scores.argmax(-1))
    assert torch.equal(row_argmax(scores), scores.argmax(-1))


# ---------------------------------------------------------------- toy world for sampling

class ToyWorld:
    """Target and draft whose distributions depend only on the token prefix."""

    def __init__(self, temperature: float, top_p: float, top_k: int) -> None:
        self.params = (temperature, top_p, top_k)
        self._target: dict[tuple[int, ...], torch.Tensor] = {}
        self._draft: dict[tuple[int, ...], torch.Tensor] = {}
        self._dynamic: dict[tuple[int, ...], tuple[Tree, torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def _logits(prefix: tuple[int, ...], salt: int) -> np.ndarray:
        return np.random.default_rng([salt, len(prefix), *prefix]).normal(scale=1.5, size=V)

    def target(self, prefix: tuple[int, ...]) -> torch.Tensor:  # (V,) processed
        if prefix not in self._target:
            logits = torch.from_numpy(self._logits(prefix, 1))
            self._target[prefix] = process_logits(logits, *self.params)
        return self._target[prefix]

    def draft(self, prefix: tuple[int, ...]) -> torch.Tensor:  # (V,) correlated with the target
        if prefix not in self._draft:
            logits = self._logits(prefix, 1) + self._logits(prefix, 2)
            self._draft[prefix] = torch.from_numpy(logits).softmax(-1)
        return self._draft[prefix]

    def node_probs(self, context: tuple[int, ...], paths: list[tuple[int, ...]],
                   source: Callable[[tuple[int, ...]], torch.Tensor]) -> torch.Tensor:
        return torch.stack([source(context + p) for p in paths])  # (N, V)


def _node_paths(tokens: list[int], parents: list[int]) -> list[tuple[int, ...]]:
    """Token path below the root for each node (root: empty)."""
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(tokens)):
        paths.append(paths[parents[i]] + (tokens[i],))
    return paths


def _dynamic_tree(world: ToyWorld,
                  context: tuple[int, ...]) -> tuple[Tree, torch.Tensor, torch.Tensor]:
    """Top-3 children of the root, top-2 children of each: (tree, draft_conf, target_probs)."""
    if context not in world._dynamic:
        tokens, parents, conf = [0], [-1], [1.0]
        for node, k in [(0, 3), (1, 2), (2, 2), (3, 2)]:
            q = world.draft(context + _node_paths(tokens, parents)[node])
            top = q.topk(k)
            tokens += top.indices.tolist()
            parents += [node] * k
            conf += top.values.tolist()
        tree = build_tree(torch.tensor(tokens), torch.tensor(parents))
        target = world.node_probs(context, _node_paths(tokens, parents), world.target)
        world._dynamic[context] = (tree, torch.tensor(conf), target)
    return world._dynamic[context]


def dynamic_round(world: ToyWorld, context: tuple[int, ...], gen: torch.Generator) -> list[int]:
    tree, conf, target = _dynamic_tree(world, context)
    accepted, bonus = accept_sampling_dynamic(tree, target, conf, gen)
    return tree.tokens[accepted[1:]].tolist() + [bonus]


STATIC_PARENTS, _, _ = static_paths_to_tree_shape([[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 1]])


def static_round(world: ToyWorld, context: tuple[int, ...], gen: torch.Generator) -> list[int]:
    """Children of every node drawn without replacement from the draft, rank = draw order."""
    parents = STATIC_PARENTS.tolist()
    tokens: list[int] = [0]
    draws: dict[int, list[int]] = {}
    for node in range(1, len(parents)):
        par = parents[node]
        if par not in draws:
            q = world.draft(context + _node_paths(tokens, parents)[par])
            draws[par] = sample_children_without_replacement(q, parents.count(par), gen).tolist()
        tokens.append(draws[par].pop(0))
    paths = _node_paths(tokens, parents)
    tree = build_tree(torch.tensor(tokens), STATIC_PARENTS)
    target = world.node_probs(context, paths, world.target)
    draft = world.node_probs(context, paths, world.draft)
    accepted, bonus = accept_sampling_static(tree, target, draft, gen)
    assert all(int(tree.parents[c]) == p for p, c in zip(accepted, accepted[1:]))
    return tree.tokens[accepted[1:]].tolist() + [bonus]


def _first_two_tokens(round_fn, world: ToyWorld, gen: torch.Generator) -> list[int]:
    """Run rounds (context = tokens emitted so far) until two tokens are emitted."""
    out: list[int] = []
    while len(out) < 2:
        out += round_fn(world, tuple(out), gen)
    return out[:2]


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit; impossible cells must be empty, cells expecting < 5 are pooled."""
    counts, probs = counts.ravel(), probs.ravel()
    if counts[probs == 0].any():
        return 0.0
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small & (probs > 0)], counts[small & (probs > 0)].sum())
    exp = np.append(expected[~small & (probs > 0)], expected[small & (probs > 0)].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue)


def _expected_joint(world: ToyWorld) -> np.ndarray:
    """(V, V): p(x1) * p(x2 | x1) under the processed target."""
    p1 = world.target(()).numpy()
    return np.stack([p1[a] * world.target((a,)).numpy() for a in range(V)])


@pytest.mark.parametrize("round_fn", [dynamic_round, static_round], ids=["dynamic", "static"])
@pytest.mark.parametrize("temperature, top_p, top_k", SAMPLING)
def test_sampling_is_lossless(round_fn, temperature: float, top_p: float, top_k: int) -> None:
    world = ToyWorld(temperature, top_p, top_k)
    gen = torch.Generator().manual_seed(1234)
    joint = np.zeros((V, V))
    for _ in range(TRIALS):
        a, b = _first_two_tokens(round_fn, world, gen)
        joint[a, b] += 1
    expected = _expected_joint(world)
    assert _chi2_pvalue(joint.sum(1), expected.sum(1)) > P_MIN  # first token
    assert _chi2_pvalue(joint, expected) > P_MIN  # first two tokens


def test_chi2_detects_untempered_distribution() -> None:
    """Power check: the joint test rejects samples drawn at temperature 1 instead of 0.7."""
    hot, cold = ToyWorld(1.0, 1.0, 0), ToyWorld(0.7, 1.0, 0)
    gen = torch.Generator().manual_seed(7)
    draws = torch.multinomial(torch.from_numpy(_expected_joint(hot).ravel()), TRIALS,
                              replacement=True, generator=gen)
    counts = np.bincount(draws.numpy(), minlength=V * V).astype(float)
    assert _chi2_pvalue(counts, _expected_joint(cold)) < P_MIN


def test_dynamic_duplicate_sibling_tokens_are_lossless() -> None:
    world = ToyWorld(0.7, 1.0, 0)
    p0 = world.target(())
    a, b = p0.argsort(descending=True)[:2].tolist()  # likely tokens: duplicates matter
    tokens = [0, a, a, b, 1, 2]
    tree = build_tree(torch.tensor(tokens), torch.tensor([-1, 0, 0, 0, 1, 2]))
    target = world.node_probs((), _node_paths(tokens, tree.parents.tolist()), world.target)
    conf = torch.tensor([1.0, 0.5, 0.3, 0.2, 0.9, 0.9])
    gen = torch.Generator().manual_seed(99)
    counts = np.zeros(V)
    for _ in range(TRIALS):
        accepted, bonus = accept_sampling_dynamic(tree, target, conf, gen)
        counts[(tree.tokens[accepted[1:]].tolist() + [bonus])[0]] += 1
    assert _chi2_pvalue(counts, p0.numpy()) > P_MIN


def test_sampling_reproducible_with_same_seed() -> None:
    world = ToyWorld(1.0, 1.0, 0)
    for round_fn in (dynamic_round, static_round):
        runs = [[round_fn(world, (), torch.Generator().manual_seed(s)) for s in range(20)]
                for _ in range(2)]
        assert runs[0] == runs[1]


def test_sample_children_without_replacement() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.rand(50, V, generator=gen).softmax(-1)  # (F, V)
    kids = sample_children_without_replacement(q, 4, gen)
    assert kids.shape == (50, 4)
    assert all(len(set(row)) == 4 for row in kids.tolist())
    with pytest.raises(ValueError):
        sample_children_without_replacement(torch.tensor([0.5, 0.5, 0.0]), 3, gen)


def test_static_rejects_child_outside_draft_support() -> None:
    tree = build_tree(torch.tensor([0, 2]), torch.tensor([-1, 0]))
    draft = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    with pytest.raises(ValueError, match="without replacement"):
        accept_sampling_static(tree, torch.full((2, 3), 1 / 3), draft, torch.Generator())
