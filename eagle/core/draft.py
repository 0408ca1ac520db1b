"""The draft phase: consume the newly accepted tokens, then grow a dynamic (EAGLE-2) or static
(EAGLE-1) candidate tree with the draft head. Model calls live here; tree bookkeeping is in tree.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..models.head import DraftHead, head_dtype
from ..models.head3 import Eagle3Head, top_token_ids
from ..models.kernels import module_kernel, wrap_weight
from ..models.kvcache import KVCache
from .tree import ancestor_mask, select_frontier, topk_children
from .verify import sample_children_without_replacement

_FIELDS = ("tokens", "parents", "depths", "logp", "scores", "ranks")


@dataclass
class Candidates:
    """Every drafted node of one round (root excluded), in drafting order; all tensors (M,)."""
    tokens: torch.Tensor
    parents: torch.Tensor  # index into this list, -1 = child of the root
    depths: torch.Tensor  # 1 = child of the root
    logp: torch.Tensor  # log draft confidence of the token given its parent
    scores: torch.Tensor  # sum of logp along the path (log of the EAGLE-2 value)
    ranks: torch.Tensor  # rank among siblings by draft confidence (static sampling: draw order)
    draft_probs: torch.Tensor | None = None  # (M + 1, V): q at the root and at each node (static sampling)

    @staticmethod
    def cat(parts: list["Candidates"]) -> "Candidates":
        return Candidates(*(torch.cat([getattr(p, n) for p in parts]) for n in _FIELDS))


class Drafter:
    """The draft head, its KV cache and the lm_head rows it scores against."""

    def __init__(self, head: DraftHead | Eagle3Head, lm_head_weight: torch.Tensor, max_len: int,
                 draft_vocab: int = 0):
        self.head = head
        self.cache: KVCache = head.new_cache(max_len)
        self.vocab_size = lm_head_weight.shape[0]
        # vocab_ids (K,): the target id of each draft token, None = the full vocabulary in order;
        # weight (K, H): the lm_head rows that score them (the target's for EAGLE-1/2, the head's own for EAGLE-3)
        self.vocab_ids, self.weight, self._project = ScoringRows.of(head).get(head, lm_head_weight, draft_vocab)
        self._beam: tuple[tuple[int, int], Beam] | None = None

    def beam(self, k: int, depth: int) -> "Beam":
        """The beam constants of a (k, depth) draft (draft_dynamic), made at the first round."""
        if self._beam is None or self._beam[0] != (k, depth):
            self._beam = ((k, depth), Beam.build(k, depth, self.weight.device))
        return self._beam[1]

    def score_with(self, weight: torch.Tensor) -> None:
        """Score against these lm_head rows (K, H) instead (see ScoringRows.project)."""
        self.weight, self._project = ScoringRows.project(self.head, weight)

    @torch.inference_mode()
    def consume(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Append pairs (f_t, x_{t+1}), tokens (T,) and the target's features (T, H), or (T, 3H) for
        an EAGLE-3 head, to the draft's prefix.
        Returns the last output (1, H): the predicted feature at the root."""
        start, n = self.cache.length, tokens.numel()
        positions = torch.arange(start, start + n, device=tokens.device)[None]
        hidden = self.head(tokens[None], features[None], positions, self.cache, start)  # (1, T, H)
        self.cache.length += n  # written contiguously at the end of the prefix: already committed
        return hidden[0, -1:]

    @torch.inference_mode()
    def expand(self, tokens: torch.Tensor, features: torch.Tensor, position: int,
               tree_rows: torch.Tensor) -> torch.Tensor:
        """Run the draft on F tree nodes of one depth. tree_rows (F, E+F): which of the E nodes expanded
        before (stored after the prefix) and of these F each node sees. Returns hidden (F, H)."""
        f = tokens.numel()
        start = self.cache.length + tree_rows.shape[1] - f
        positions = torch.full((1, f), position, device=tokens.device)
        return self.head(tokens[None], features[None], positions, self.cache, start, tree_rows)[0]

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(F, H) -> (F, K) draft log-probabilities over the draft vocabulary."""
        features = self.head.logit_features(hidden)
        logits = features @ self.weight.T if self._project is None else self._project(features)
        return torch.log_softmax(logits.float(), dim=-1)

    def full_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.vocab_ids is None else self.vocab_ids[ids]

    def full_probs(self, logp: torch.Tensor) -> torch.Tensor:
        """(F, K) log-probs -> (F, V) probabilities on the full vocabulary (zero outside the subset)."""
        if self.vocab_ids is None:
            return logp.exp()
        out = torch.zeros(logp.shape[0], self.vocab_size, device=logp.device)
        return out.index_copy_(1, self.vocab_ids, logp.exp())


class ScoringRows:
    """A head's draft vocabularies, each as (target ids, scoring rows, projection), made once per
    vocabulary, precision and kernel and kept on the head, so a generation does not copy, pack or
    quantize its rows again (8,192 rows of SmolLM2's: 9 ms packed bf16 and 36 ms on int8 weights at
    every generation, 2026-12-07, AMD EPYC Zen 5). Keyed by the rows' tensor and its version too: rows
    trained in place are made again. A copy of the head starts without them (it casts or packs itself)."""
    SLOTS = 4  # vocabularies kept per head: auto's choice moves between two or three with the context

    def __init__(self) -> None:
        self.made: dict[tuple, tuple[torch.Tensor | None, torch.Tensor, Callable | None]] = {}

    def __deepcopy__(self, memo: dict) -> "ScoringRows":
        return ScoringRows()

    @staticmethod
    def of(head: DraftHead | Eagle3Head) -> "ScoringRows":
        if "scoring_rows" not in head.__dict__:
            head.scoring_rows = ScoringRows()
        return head.__dict__["scoring_rows"]

    def get(self, head: DraftHead | Eagle3Head, lm_head_weight: torch.Tensor,
            draft_vocab: int) -> tuple[torch.Tensor | None, torch.Tensor, Callable | None]:
        """(vocab ids or None, rows (K, H), projection or None) of the head's draft_vocab most frequent
        tokens (FR-Spec; all without token counts)."""
        vocab_ids, weight = head.draft_vocab(lm_head_weight)
        key = (draft_vocab, id(weight), weight._version, tuple(weight.shape), weight.device, head_dtype(head),
               module_kernel(head))
        if key not in self.made:
            counts = head.token_counts if vocab_ids is None else head.token_counts[vocab_ids]
            rows = top_token_ids(counts, draft_vocab)
            if rows is not None:
                rows = rows.to(weight.device)
                vocab_ids = rows if vocab_ids is None else vocab_ids[rows]
                weight = weight[rows]
            self.made = dict(list(self.made.items())[-(self.SLOTS - 1):])
            self.made[key] = (vocab_ids, *self.project(head, weight))
        return self.made[key]

    @staticmethod
    def project(head: DraftHead | Eagle3Head, weight: torch.Tensor) -> tuple[torch.Tensor, Callable | None]:
        """The rows (K, H) in the head's precision (a copy of the target's when the head drafts in a
        precision of its own: cast_head) and their projection on the head's kernel (packed fp32 or bf16
        through oneDNN, bf16 on the AVX2 kernel or on int8 weights: eagle.models.kernels; None: torch's)."""
        weight = weight.to(head_dtype(head))
        return weight, wrap_weight(weight, module_kernel(head))


@dataclass(frozen=True)
class Beam:
    """What every round of an EAGLE-2 beam of width k and `depth` expansions repeats, made once per
    generation (Drafter.beam): the root's children's columns, each later level's depth and rank columns,
    and the ancestor matrix of the expanded nodes, empty (a round fills one block a level). About a dozen
    tensor creations a round fewer, each a few microseconds on a CPU."""
    parents0: torch.Tensor  # (k,) -1: the root's children hang from the root
    depths: tuple[torch.Tensor, ...]  # per level d = 0..depth: (k,) ones, then (k * k,) filled d + 1
    ranks: tuple[torch.Tensor, torch.Tensor]  # (k,) 0..k-1 for the root's children, (k * k,) for a level
    eye: torch.Tensor  # (k, k) bool: each node of a level sees itself
    ancestors: torch.Tensor  # (k * depth, k * depth) bool zeros: the expanded nodes' ancestor matrix

    @staticmethod
    def build(k: int, depth: int, device: torch.device) -> "Beam":
        levels = [torch.ones(k, dtype=torch.long, device=device)]
        levels += [torch.full((k * k,), d + 1, dtype=torch.long, device=device) for d in range(1, depth + 1)]
        rank = torch.arange(k, device=device)
        return Beam(torch.full((k,), -1, dtype=torch.long, device=device), tuple(levels), (rank, rank.repeat(k)),
                    torch.eye(k, dtype=torch.bool, device=device),
                    torch.zeros(k * depth, k * depth, dtype=torch.bool, device=device))


def _no_lap(name: str) -> None:
    pass


def draft_dynamic(drafter: Drafter, root_hidden: torch.Tensor, depth: int, top_k: int,
                  lap: Callable[[str], None] = _no_lap) -> Candidates:
    """EAGLE-2 expansion: a beam of the top_k nodes by value, each given its top_k children, `depth`
    times. Returns every candidate (top_k + depth * top_k^2 nodes); reranking happens later.
    lap(f"draft.{d}") is called after each draft step (0: the root's children), for a PhaseClock."""
    dev = root_hidden.device
    k = min(top_k, drafter.weight.shape[0])
    beam = drafter.beam(k, depth)
    tok, logp, score = topk_children(drafter.log_probs(root_hidden), torch.zeros(1, device=dev), k)
    parts = [Candidates(drafter.full_ids(tok[0]), beam.parents0, beam.depths[0], logp[0], score[0], beam.ranks[0])]
    frontier = beam.ranks[0]  # candidate ids of the nodes to expand next: the root's children are 0..k-1
    feats, frontier_tok, frontier_score = root_hidden.expand(k, -1), parts[0].tokens, score[0]
    # anc[:e, :e]: which of the e expanded nodes each one descends from (or is); filled a level at a time
    anc, parent_rows, n_cand = beam.ancestors.clone(), None, k
    root_pos = drafter.cache.length
    lap("draft.0")
    for d in range(1, depth + 1):
        e = (d - 1) * k  # expanded before this level
        if parent_rows is not None:
            anc[e:e + k, :e] = anc[parent_rows, :e]
        anc[e:e + k, e:e + k] = beam.eye
        hidden = drafter.expand(frontier_tok, feats, root_pos + d - 1, anc[e:e + k, :e + k])  # (k, H)
        tok, logp, score = topk_children(drafter.log_probs(hidden), frontier_score, k)  # (k, k)
        parts.append(Candidates(drafter.full_ids(tok.flatten()), frontier.repeat_interleave(k), beam.depths[d],
                                logp.flatten(), score.flatten(), beam.ranks[1]))
        best = select_frontier(score.flatten(), k)  # the beam: global top_k of the new children
        parent_rows = e + best // k
        frontier, feats = n_cand + best, hidden[best // k]
        frontier_tok, frontier_score = parts[-1].tokens[best], score.flatten()[best]
        n_cand += k * k
        lap(f"draft.{d}")
    return Candidates.cat(parts)


@dataclass(frozen=True)
class StaticLevel:
    """One level of a static tree, precomputed so a round needs no host syncs or index searches."""
    nodes: torch.Tensor  # (P,) nodes of this level that have children (run through the draft)
    rows: torch.Tensor  # (P, E+P) which expanded non-root nodes each sees (ancestors and itself)
    kids: torch.Tensor  # (C,) their children
    kid_row: torch.Tensor  # (C,) index into `nodes` of each kid's parent
    kid_rank: torch.Tensor  # (C,)
    width: int  # children drawn per node (max rank + 1)


@dataclass(frozen=True)
class StaticPlan:
    parents: torch.Tensor  # (N,) root at 0
    ranks: torch.Tensor
    depths: torch.Tensor
    path: torch.Tensor  # (N-1, N-1) float: ancestors-or-self among non-root nodes (path sums)
    levels: tuple[StaticLevel, ...]

    @property
    def max_depth(self) -> int:
        return len(self.levels)

    @staticmethod
    def build(parents: torch.Tensor, ranks: torch.Tensor, depths: torch.Tensor,
              device: torch.device | str = "cpu") -> "StaticPlan":
        anc = ancestor_mask(parents)[:, 1:]  # (N, N-1)
        levels, expanded = [], []
        for level in range(int(depths.max())):
            nodes = [i for i in range(parents.numel()) if depths[i] == level and (parents == i).any()]
            expanded += [i - 1 for i in nodes if i > 0]
            kids = [c for c in range(parents.numel()) if int(parents[c]) in nodes]
            kid_row = [nodes.index(int(parents[c])) for c in kids]
            levels.append(StaticLevel(_long(nodes, device), anc[nodes][:, expanded].to(device),
                                      _long(kids, device), _long(kid_row, device), ranks[kids].to(device),
                                      int(ranks[kids].max()) + 1))
        return StaticPlan(parents.to(device), ranks.to(device), depths.to(device),
                          anc[1:].float().to(device), tuple(levels))


def _long(values: list[int], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def draft_static(drafter: Drafter, root_hidden: torch.Tensor, plan: StaticPlan,
                 generator: torch.Generator | None = None, lap: Callable[[str], None] = _no_lap) -> Candidates:
    """EAGLE-1 static tree: the node of rank r under a parent takes the parent's r-th best draft token
    (the r-th draw without replacement when sampling with `generator`, which also records q at every
    node). Returns the N-1 non-root nodes in tree order; lap(f"draft.{level}") after each level."""
    widest = max(lv.width for lv in plan.levels)
    if widest > drafter.weight.shape[0]:
        raise ValueError(f"the static tree has a node of {widest} children but the draft vocabulary holds "
                         f"{drafter.weight.shape[0]} tokens")
    dev, n = root_hidden.device, plan.parents.numel()
    hidden = root_hidden.new_zeros(n, root_hidden.shape[-1])
    hidden[0] = root_hidden[0]
    tokens = torch.zeros(n, dtype=torch.long, device=dev)
    logp_node = torch.zeros(n, device=dev)
    q = None if generator is None else torch.zeros(n, drafter.vocab_size, device=dev)
    for depth, lv in enumerate(plan.levels):
        if depth > 0:
            hidden[lv.nodes] = drafter.expand(tokens[lv.nodes], hidden[plan.parents[lv.nodes]],
                                              drafter.cache.length + depth - 1, lv.rows)
        logp = drafter.log_probs(hidden[lv.nodes])  # (P, K)
        if generator is None:
            choice = logp.topk(lv.width, dim=-1).indices  # (P, width)
        else:
            q[lv.nodes] = drafter.full_probs(logp)
            choice = sample_children_without_replacement(logp.exp().cpu(), lv.width, generator).to(dev)
        picked = choice[lv.kid_row, lv.kid_rank]  # (C,)
        tokens[lv.kids] = drafter.full_ids(picked)
        logp_node[lv.kids] = logp[lv.kid_row, picked]
        lap(f"draft.{depth}")
    scores = plan.path @ logp_node[1:]  # sum of logp along each path
    return Candidates(tokens[1:], plan.parents[1:] - 1, plan.depths[1:], logp_node[1:], scores,
                      plan.ranks[1:], q)
