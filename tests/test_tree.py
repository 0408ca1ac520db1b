"""Invariants of eagle.core.tree: mask, depths, retrieve paths, reranking, static tree."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle.core.tree import (
    ancestor_mask,
    build_tree,
    load_static_paths,
    rerank,
    select_frontier,
    static_paths_to_tree_shape,
    topk_children,
)

FUZZ = settings(max_examples=150, deadline=None)


@st.composite
def tree_parents(draw, max_n: int = 25) -> torch.Tensor:
    """Random tree parent array with parents[i] < i."""
    n = draw(st.integers(1, max_n))
    return torch.tensor([-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)], dtype=torch.long)


@st.composite
def candidate_forest(draw, max_m: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffled candidate list: (parents (M,), depths (M,)), -1 = child of the root."""
    m = draw(st.integers(0, max_m))
    topo = [draw(st.integers(-1, i - 1)) for i in range(m)]
    perm = draw(st.permutations(range(m)))  # new node j is old node perm[j]
    new_of = {old: new for new, old in enumerate(perm)}
    parents = [new_of[topo[old]] if topo[old] >= 0 else -1 for old in perm]
    return torch.tensor(parents, dtype=torch.long), torch.tensor(_depths(parents), dtype=torch.long)


def _ancestors(parents: list[int], i: int) -> list[int]:
    out = []
    while parents[i] >= 0:
        i = parents[i]
        out.append(i)
    return out


def _depths(parents: list[int]) -> list[int]:
    """Depth of each candidate; children of the root (parent -1) have depth 1."""
    return [len(_ancestors(parents, i)) + 1 for i in range(len(parents))]


def _brute_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        mask[i, [i] + _ancestors(parents, i)] = True
    return mask


@FUZZ
@given(tree_parents())
def test_build_tree_invariants(parents: torch.Tensor) -> None:
    n = parents.numel()
    tree = build_tree(torch.arange(n) + 100, parents)
    plist = parents.tolist()
    assert torch.equal(tree.mask, _brute_mask(plist))
    assert tree.depths[0] == 0
    assert tree.depths.tolist() == [len(_ancestors(plist, i)) for i in range(n)]
    assert torch.equal(tree.positions, tree.depths)
    assert tree.retrieve.shape[1] == tree.max_depth + 1
    leaves = {i for i in range(n) if i not in plist}
    ends = []
    for row in tree.retrieve.tolist():
        valid = [x for x in row if x >= 0]
        assert row == valid + [-1] * (len(row) - len(valid))  # padding only at the end
        assert valid[0] == 0
        assert all(plist[c] == p for p, c in zip(valid, valid[1:]))
        ends.append(valid[-1])
    assert sorted(ends) == sorted(leaves) and len(ends) == len(leaves)
    assert tree.leaves.tolist() == ends


@FUZZ
@given(tree_parents(), st.integers(0, 3))
def test_the_trusted_hot_path_builds_the_same_tree(parents: torch.Tensor, slack: int) -> None:
    """With a depth bound (the decoder's draft depth, possibly loose) build_tree skips its checks and
    the host reads of its level loop, and builds exactly the checked tree."""
    checked = build_tree(torch.arange(parents.numel()) + 100, parents)
    trusted = build_tree(torch.arange(parents.numel()) + 100, parents, max_depth=checked.max_depth + slack)
    for field in ("tokens", "parents", "depths", "mask", "retrieve", "leaves"):
        assert torch.equal(getattr(trusted, field), getattr(checked, field)), field


@FUZZ
@given(candidate_forest())
def test_ancestor_mask_forest_any_order(forest: tuple[torch.Tensor, torch.Tensor]) -> None:
    parents, _ = forest
    assert torch.equal(ancestor_mask(parents), _brute_mask(parents.tolist()))


def test_degenerate_trees() -> None:
    root = build_tree(torch.tensor([7]), torch.tensor([-1]))
    assert root.retrieve.tolist() == [[0]] and root.mask.tolist() == [[True]]
    star = build_tree(torch.tensor([7, 1, 2, 3]), torch.tensor([-1, 0, 0, 0]))
    assert star.retrieve.tolist() == [[0, 1], [0, 2], [0, 3]]
    assert star.depths.tolist() == [0, 1, 1, 1]
    assert star.children(0).tolist() == [1, 2, 3]


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 2, 0], [-1, -1], [-1, 5], [-2, 0]])
def test_build_tree_rejects_bad_parents(parents: list[int]) -> None:
    with pytest.raises(ValueError):
        build_tree(torch.zeros(len(parents), dtype=torch.long), torch.tensor(parents))


def test_ancestor_mask_rejects_cycle() -> None:
    with pytest.raises(ValueError, match="cycle"):
        ancestor_mask(torch.tensor([-1, 2, 1]))


score_lists = st.one_of(
    st.lists(st.sampled_from([0.0, -1.0, -2.0]), min_size=20, max_size=20),  # many ties
    st.lists(st.just(-3.0), min_size=20, max_size=20),  # all equal
    st.lists(st.floats(-10, 0), min_size=20, max_size=20),
)


def _rank_key(value: list[float], depths: list[int], i: int) -> tuple[float, int, int]:
    return (-value[i], depths[i], i)


def _check_rerank_output(kept: list[int], parents: list[int], depths: list[int],
                         n_keep: int) -> None:
    assert len(kept) == min(n_keep, len(parents)) == len(set(kept))
    pos = {node: j for j, node in enumerate(kept)}
    for node in kept:
        if parents[node] >= 0:  # ancestor-closed and parents first
            assert parents[node] in pos and pos[parents[node]] < pos[node]
    assert [depths[i] for i in kept] == sorted(depths[i] for i in kept)


@FUZZ
@given(candidate_forest(), score_lists, st.one_of(st.sampled_from([0, 1]), st.integers(0, 25)))
def test_rerank_arbitrary_scores(forest, scores: list[float], n_keep: int) -> None:
    parents, depths = forest
    m = parents.numel()
    score_t = torch.tensor(scores[:m], dtype=torch.float64)
    kept = rerank(score_t, parents, depths, n_keep).tolist()
    plist, dlist = parents.tolist(), depths.tolist()
    _check_rerank_output(kept, plist, dlist, n_keep)
    # the decoder's trusted path (a bound on the depths, no checks) keeps the same nodes in the same order
    assert rerank(score_t, parents, depths, n_keep, max(dlist, default=1)).tolist() == kept
    # Documented rule: rank by the minimum score along the candidate path.
    value = [min(scores[j] for j in [i] + _ancestors(plist, i)) for i in range(m)]
    expected = sorted(range(m), key=lambda i: _rank_key(value, dlist, i))[:n_keep]
    assert set(kept) == set(expected)


@FUZZ
@given(candidate_forest(), st.lists(st.sampled_from([0.0, -0.5, -1.0]), min_size=20, max_size=20),
       st.integers(0, 25))
def test_rerank_monotone_scores_is_plain_top_n(forest, logps: list[float], n_keep: int) -> None:
    """EAGLE-2 scores (sums of log-probs) never increase along a path: plain top-n with ties."""
    parents, depths = forest
    plist, dlist = parents.tolist(), depths.tolist()
    m = len(plist)
    scores = [sum(logps[j] for j in [i] + _ancestors(plist, i)) for i in range(m)]
    kept = rerank(torch.tensor(scores), parents, depths, n_keep).tolist()
    _check_rerank_output(kept, plist, dlist, n_keep)
    expected = sorted(range(m), key=lambda i: _rank_key(scores, dlist, i))[:n_keep]
    assert set(kept) == set(expected)


def test_rerank_tie_prefers_shallower_then_lower_index() -> None:
    parents = torch.tensor([-1, 0, -1, 2])
    depths = torch.tensor([1, 2, 1, 2])
    kept = rerank(torch.zeros(4), parents, depths, 3).tolist()
    assert kept == [0, 2, 1]


def test_rerank_validates() -> None:
    parents, depths = torch.tensor([-1, 0]), torch.tensor([1, 2])
    with pytest.raises(ValueError):
        rerank(torch.zeros(2), parents, depths, -1)
    with pytest.raises(ValueError):
        rerank(torch.tensor([0.0, float("nan")]), parents, depths, 1)
    with pytest.raises(ValueError):
        rerank(torch.zeros(2), parents, torch.tensor([1, 1]), 1)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_topk_children(k: int) -> None:
    gen = torch.Generator().manual_seed(0)
    log_probs = torch.randn(4, 6, generator=gen).log_softmax(-1)  # (F, V)
    parent_scores = torch.tensor([0.0, -1.0, -2.0, -0.5])
    tokens, logp, scores = topk_children(log_probs, parent_scores, k)
    assert tokens.shape == logp.shape == scores.shape == (4, k)
    assert tokens.dtype == torch.long
    assert torch.equal(logp, log_probs.gather(1, tokens))
    assert torch.equal(logp, log_probs.sort(-1, descending=True).values[:, :k])
    assert torch.allclose(scores, parent_scores[:, None] + logp)


def test_topk_children_validates() -> None:
    with pytest.raises(ValueError):
        topk_children(torch.zeros(2, 3), torch.zeros(2), 4)
    with pytest.raises(ValueError):
        topk_children(torch.zeros(2, 3), torch.zeros(3), 1)


def test_select_frontier() -> None:
    scores = torch.tensor([-1.0, -0.5, -1.0, -3.0, -0.5])
    assert select_frontier(scores, 3).tolist() == [1, 4, 0]  # ties -> lower index
    assert select_frontier(scores, 1).tolist() == [1]
    assert select_frontier(scores, 9).tolist() == [1, 4, 0, 2, 3]
    assert select_frontier(scores, 0).numel() == 0


def test_static_tree_facts() -> None:
    paths = load_static_paths()
    parents, ranks, depths = static_paths_to_tree_shape(paths)
    assert parents.numel() == 26 and parents[0] == -1
    assert int(depths.max()) == 5
    assert torch.bincount(depths).tolist() == [1, 4, 8, 8, 3, 2]
    tree = build_tree(torch.zeros(26, dtype=torch.long), parents)
    assert torch.equal(tree.depths, depths)
    assert tree.retrieve.shape == (15, 6)
    # Rank of a node is its path's last entry; siblings are in rank order.
    ordered = sorted(paths, key=lambda p: (len(p), p))
    assert ranks.tolist() == [-1] + [p[-1] for p in ordered]
    for node in range(26):
        kids = tree.children(node)
        assert ranks[kids].tolist() == list(range(kids.numel()))


@pytest.mark.parametrize("paths", [[[0, 1]], [[0], [-1]], [[0], []], [[0], [0]],
                                   [[0], ["a"]], [[0], [True]]])
def test_static_paths_validation(paths) -> None:
    with pytest.raises(ValueError):
        static_paths_to_tree_shape(paths)


def test_load_static_paths_custom(tmp_path) -> None:
    path = tmp_path / "tree.json"
    path.write_text(json.dumps([[0], [1], [0, 0]]))
    assert load_static_paths(path) == [[0], [1], [0, 0]]
    parents, ranks, depths = static_paths_to_tree_shape(load_static_paths(path))
    assert parents.tolist() == [-1, 0, 0, 1]
    assert ranks.tolist() == [-1, 0, 1, 0] and depths.tolist() == [0, 1, 1, 2]


@FUZZ
@given(candidate_forest(), score_lists, st.integers(0, 25), st.integers(0, 2))
def test_rerank_with_a_depth_bound_keeps_the_same_nodes(forest, scores: list[float], n_keep: int, slack: int) -> None:
    parents, depths = forest
    score_t = torch.tensor(scores[:parents.numel()], dtype=torch.float64)
    bound = int(depths.max()) + slack if depths.numel() else slack
    assert torch.equal(rerank(score_t, parents, depths, n_keep, bound), rerank(score_t, parents, depths, n_keep))
