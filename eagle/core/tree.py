"""Draft-tree construction as pure tensor functions (no model involved).

Conventions: node 0 is the root (the last token the target produced); parents precede
children (``parents[i] < i``); a node's position offset is its depth below the root.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..resources import resource_path

DEFAULT_STATIC_TREE = resource_path("eagle1_mc_sim_7b_63.json")


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields make == ambiguous
class Tree:
    tokens: torch.Tensor  # (N,) long; tokens[0] is the root token
    parents: torch.Tensor  # (N,) long; parents[0] == -1, parents[i] < i
    depths: torch.Tensor  # (N,) long; depths[0] == 0
    mask: torch.Tensor  # (N, N) bool; mask[i, j] == (j is an ancestor of i or j == i)

    # The paths, made when first asked for: a decoding round reads its accepted path from the mask
    # (eagle.core.verify.accept_greedy_tokens), so it never builds them (11 small ops a round)
    @functools.cached_property
    def _paths(self) -> tuple[torch.Tensor, torch.Tensor]:
        return retrieve_paths(self.mask, self.parents, self.depths)

    @property
    def retrieve(self) -> torch.Tensor:
        """(L, max_depth + 1) long: root..leaf node indices of each leaf's path, -1 padded."""
        return self._paths[0]

    @property
    def leaves(self) -> torch.Tensor:
        """(L,) long: the leaf node of each retrieve row, ascending."""
        return self._paths[1]

    @property
    def positions(self) -> torch.Tensor:
        """Position offsets (N,) relative to the root; the caller adds the prefix length."""
        return self.depths

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def children(self, node: int) -> torch.Tensor:
        """Children of `node` (ascending node index)."""
        return (self.parents == node).nonzero().flatten()


def _check_parent_array(parents: torch.Tensor) -> None:
    """Parents must be a 1-D long tensor with entries in [-1, N) and no self-loops."""
    if parents.dim() != 1:
        raise ValueError(f"parents must be 1-D, got shape {tuple(parents.shape)}")
    if parents.dtype != torch.long:
        raise ValueError(f"parents must be torch.long, got {parents.dtype}")
    n = parents.numel()
    if n and (parents.min() < -1 or parents.max() >= n):
        raise ValueError("parents entries must lie in [-1, N)")
    if (parents == torch.arange(n, device=parents.device)).any():
        raise ValueError("a node cannot be its own parent")


def ancestor_mask(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """(N, N) bool: mask[i, j] is True iff j is i itself or an ancestor of i.

    Works for any forest (several -1 entries allowed), in any node order. Checked: one vectorised
    parent lookup per level until every node has reached its root. Given `max_depth` (a bound the
    caller guarantees, e.g. the decoder's draft depth), the input is trusted: no checks, no value
    read back to the host, ceil(log2(max_depth)) squarings (the decoder's hot path; tests check it
    builds the checked mask).
    """
    n = parents.numel()
    rows = torch.arange(n, device=parents.device)
    if max_depth is not None:
        return _trusted_ancestor_mask(parents, rows, max_depth)
    mask = torch.eye(n, dtype=torch.bool, device=parents.device)
    cur = parents.clone()  # (N,) current ancestor of each node, -1 once past its root
    _check_parent_array(parents)
    for _ in range(n + 1):  # a chain of N nodes needs N - 1 steps plus the final check
        live = cur >= 0
        if not live.any():
            return mask
        mask[rows[live], cur[live]] = True
        cur = torch.where(live, parents[cur.clamp(min=0)], cur)
    raise ValueError("parents contain a cycle")


def _trusted_ancestor_mask(parents: torch.Tensor, rows: torch.Tensor, max_depth: int) -> torch.Tensor:
    """ancestor_mask for a forest no deeper than max_depth, by repeated squaring: A = I + (child -> parent)
    reaches every ancestor within 2^s steps after s squarings, so ceil(log2(max_depth)) small matmuls
    replace one parent lookup per level (a 10-node lookup branch: 4 matmuls, not 10 levels of indexing;
    ~19 instead of ~130 us on a CPU). Entries are path counts clamped to 1 each step: exact in fp32."""
    reach = torch.eye(parents.numel(), device=parents.device)  # (N, N) fp32
    # roots (-1) add 0 at column 0: no branch, no host read
    reach.index_put_((rows, parents.clamp(min=0)), (parents >= 0).float(), accumulate=True)
    for _ in range(math.ceil(math.log2(max(max_depth, 1)))):
        reach = (reach @ reach).clamp_(max=1)
    return reach.bool()


def _check_tree_parents(parents: torch.Tensor) -> None:
    _check_parent_array(parents)
    n = parents.numel()
    if n == 0 or parents[0] != -1:
        raise ValueError("a tree needs a root: parents[0] must be -1")
    if n > 1:
        rest = parents[1:]
        if (rest < 0).any() or (rest >= torch.arange(1, n, device=parents.device)).any():
            raise ValueError("parents[i] must satisfy 0 <= parents[i] < i for i > 0")


def retrieve_paths(mask: torch.Tensor, parents: torch.Tensor,
                   depths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Root-to-leaf node paths, one row per leaf: (retrieve (L, D+1), leaves (L,)).

    A leaf's path holds each of its ancestors-or-self (its mask row) at that node's depth.
    """
    n = parents.numel()
    is_leaf = torch.ones(n, dtype=torch.bool, device=parents.device)
    is_leaf[parents[parents >= 0]] = False
    leaves = is_leaf.nonzero().flatten()  # (L,)
    leaf_i, node_i = mask[leaves].nonzero(as_tuple=True)  # (L, N) rows -> (leaf row, path node) pairs
    retrieve = torch.full((leaves.numel(), int(depths.max()) + 1), -1, dtype=torch.long, device=parents.device)
    retrieve[leaf_i, depths[node_i]] = node_i
    return retrieve, leaves


def build_tree(tokens: torch.Tensor, parents: torch.Tensor, max_depth: int | None = None) -> Tree:
    """Build a Tree (depths and ancestor mask; its retrieve paths when first asked) from tokens (N,) and
    parents (N,).
    max_depth: a depth bound the caller guarantees; the parent array is then trusted, unchecked
    (see ancestor_mask)."""
    if max_depth is None:
        if tokens.shape != parents.shape:
            raise ValueError(f"tokens {tuple(tokens.shape)} and parents {tuple(parents.shape)} differ")
        _check_tree_parents(parents)
    mask = ancestor_mask(parents, max_depth)  # (N, N)
    depths = mask.sum(-1) - 1  # (N,) number of strict ancestors
    return Tree(tokens=tokens.long(), parents=parents, depths=depths, mask=mask)


def topk_children(log_probs: torch.Tensor, parent_scores: torch.Tensor,
                  k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k children of each frontier node: (tokens (F,k), logp (F,k), scores (F,k)).

    A child's score is its parent's score plus its own log-probability, i.e. the log of the
    product of draft confidences along the path (the EAGLE-2 node value).
    """
    if log_probs.dim() != 2 or parent_scores.shape != log_probs.shape[:1]:
        raise ValueError(f"expected log_probs (F, V) and parent_scores (F,), got "
                         f"{tuple(log_probs.shape)} and {tuple(parent_scores.shape)}")
    if not 1 <= k <= log_probs.shape[1]:
        raise ValueError(f"k must be in [1, V={log_probs.shape[1]}], got {k}")
    logp, tokens = log_probs.topk(k, dim=-1)  # (F, k)
    scores = parent_scores[:, None] + logp  # (F, k)
    return tokens, logp, scores


def select_frontier(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (min(k, M),) of the k best scores, best first; ties go to the lower index."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D, got shape {tuple(scores.shape)}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    order = torch.argsort(scores, descending=True, stable=True)  # (M,)
    return order[:k]


def _path_min(scores: torch.Tensor, parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """(M,) minimum score over each node and its candidate ancestors (max_depth: a trusted bound on the
    candidates' depths, so max_depth - 1 steps, as a node at depth d has d - 1 candidate ancestors, and
    no host reads; else until every path ended, cycles refused)."""
    value, cur = scores, parents
    for _ in range(parents.numel() + 1 if max_depth is None else max_depth - 1):
        live = cur >= 0
        if max_depth is None and not live.any():
            return value
        up = cur.clamp(min=0)
        value = torch.where(live, torch.minimum(value, scores[up]), value)
        cur = torch.where(live, parents[up], cur)
    if max_depth is not None:
        return value
    raise ValueError("parents contain a cycle")


def _check_rerank_inputs(scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor) -> None:
    if scores.dim() != 1 or parents.shape != scores.shape or depths.shape != scores.shape:
        raise ValueError("scores, parents and depths must be 1-D of equal length")
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN")
    _check_parent_array(parents)
    has_parent = parents >= 0
    if (depths[has_parent] != depths[parents[has_parent]] + 1).any():
        raise ValueError("depths must satisfy depths[c] == depths[parents[c]] + 1")


def rerank(scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
           n_keep: int, max_depth: int | None = None) -> torch.Tensor:
    """Keep the min(n_keep, M) best candidates, ancestor-closed, parents before children.

    parents index into the same candidate list (-1 = child of the root). The first n_keep of
    `ranking`, returned in tree order (`tree_order`: sorted by (depth, index)). max_depth: a bound on
    the candidates' depths the caller guarantees; the inputs are then trusted (the decoder's hot path).
    """
    if n_keep < 0:
        raise ValueError(f"n_keep must be >= 0, got {n_keep}")
    return tree_order(ranking(scores, parents, depths, max_depth)[:n_keep], depths)


def ranking(scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
            max_depth: int | None = None) -> torch.Tensor:
    """(M,) every candidate, best first: highest value, then shallower, then lower index. The value of
    a node is the minimum score along its candidate path; for EAGLE-2 scores (sums of log-probs, never
    increasing along a path) this equals the score itself, so this is plain top-n. The cap makes every
    parent rank strictly before its children (equal value -> shallower wins), so any prefix of the
    ranking is ancestor-closed even under ties or for arbitrary scores: one ranking serves every tree
    size. max_depth: as rerank's."""
    if max_depth is None:
        _check_rerank_inputs(scores, parents, depths)
    value = _path_min(scores, parents, max_depth)  # (M,)
    by_depth = torch.argsort(depths, stable=True)  # stable: index breaks remaining ties
    return by_depth[torch.argsort(value[by_depth], descending=True, stable=True)]


def tree_order(kept: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """Candidate ids kept (a prefix of a ranking) sorted by (depth, index): parents before children."""
    return kept[torch.argsort(depths[kept] * depths.numel() + kept)]


def _check_static_paths(paths: list[list[int]]) -> None:
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if not isinstance(path, (list, tuple)) or not path:
            raise ValueError(f"each path must be a non-empty list of ranks, got {path!r}")
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in path):
            raise ValueError(f"ranks must be integers >= 0, got {path!r}")
        key = tuple(path)
        if key in seen:
            raise ValueError(f"duplicate path {path!r}")
        seen.add(key)
    for key in seen:
        if len(key) > 1 and key[:-1] not in seen:
            raise ValueError(f"path {list(key)!r} has no parent path {list(key[:-1])!r}")


def static_paths_to_tree_shape(
        paths: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-1 static tree from paths of child ranks -> (parents, ranks, depths), each (N,).

    Node 0 is the root (rank -1); the others are ordered by (depth, path), as in the
    official code, so siblings appear in rank order and parents precede children.
    """
    _check_static_paths(paths)
    ordered = sorted((tuple(p) for p in paths), key=lambda p: (len(p), p))
    index = {(): 0} | {p: i + 1 for i, p in enumerate(ordered)}
    parents = torch.tensor([-1] + [index[p[:-1]] for p in ordered], dtype=torch.long)
    ranks = torch.tensor([-1] + [p[-1] for p in ordered], dtype=torch.long)
    depths = torch.tensor([0] + [len(p) for p in ordered], dtype=torch.long)
    return parents, ranks, depths


def load_static_paths(path: str | Path | None = None) -> list[list[int]]:
    """Read a static tree (JSON list of rank paths); defaults to the EAGLE-1 default tree."""
    with open(DEFAULT_STATIC_TREE if path is None else path, encoding="utf-8") as f:
        paths = json.load(f)
    _check_static_paths(paths)
    return [list(p) for p in paths]
