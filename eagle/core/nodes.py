"""A round as trace records: the drafted candidates, the kept ones, the prompt-lookup branch and the
accepted path, turned into NodeRecords with one device-to-host copy per round (eagle.records.trace)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..records.trace import NodeRecord
from .detok import token_text
from .draft import Candidates
from .tree import Tree


@dataclass
class Round:
    """One round's draft and decision, still on the device."""
    root: int
    cand: Candidates | None  # every drafted node (None in vanilla)
    kept: torch.Tensor | None  # (N-1,) candidate ids verified as tree nodes 1..N-1
    tree: Tree
    accepted: list[int]  # tree node indices, root first
    bonus: int
    node_probs: torch.Tensor  # (N,) the target's probability of each tree node's token at its parent
    lookup: list[int] = field(default_factory=list)  # the prompt-lookup branch: the tree's last nodes


class TokenTexts:
    """Memoised token id -> label (eagle.core.detok.token_text: a partial character shows as its bytes),
    so traces stay cheap in the hot loop."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self._cache = tokenizer, {}

    def __call__(self, token: int) -> str:
        text = self._cache.get(token)
        if text is None:
            text = self._cache[token] = token_text(self.tokenizer, token)
        return text


def trace_nodes(rnd: Round, texts: TokenTexts) -> tuple[list[NodeRecord], list[int]]:
    """Every drafted node as a trace record (node id = candidate index + 1; the root is 0), then the
    prompt-lookup branch's nodes, and the accepted path as node ids. One host transfer per round."""
    root = NodeRecord(0, -1, 0, rnd.root, texts(rnd.root), 1.0, 1.0, 0, True, True, None)
    if rnd.cand is None and not rnd.lookup:
        return [root], [0]
    c = rnd.cand
    m, k = (0, 0) if c is None else (c.tokens.numel(), rnd.kept.numel())
    # one device-to-host copy for the round's records, in float64 (it holds every id exactly): four
    # integer (M,) columns and the kept ids, confidence and value (M,) each, p(token | parent) (N,);
    # six tensor ops, not twelve (a round's records cost ~0.25 ms on a CPU)
    parts = [rnd.node_probs] if c is None else \
        [torch.cat([c.parents, c.depths, c.tokens, c.ranks, rnd.kept]).double(),
         torch.cat([c.logp, c.scores]).exp(), rnd.node_probs]
    flat = torch.cat(parts).double().tolist()
    kept = [int(x) for x in flat[4 * m:4 * m + k]]
    node_probs = flat[6 * m + k:]
    accepted = set(rnd.accepted)
    nodes = [root] + _draft_records(flat[:4 * m], flat[4 * m + k:6 * m + k], m, kept, accepted, node_probs, texts)
    nodes += _lookup_records(rnd, m, 1 + k, accepted, node_probs, texts)
    node_of_tree = [0] + [cid + 1 for cid in kept] + [m + 1 + j for j in range(len(rnd.lookup))]
    return nodes, [node_of_tree[i] for i in rnd.accepted]


def _draft_records(ints: list[float], floats: list[float], m: int, kept: list[int], accepted: set[int],
                   node_probs: list[float], texts: TokenTexts) -> list[NodeRecord]:
    """The head's M candidates as records, from their columns laid end to end: parent, depth, token and
    rank in `ints`, confidence and value in `floats`."""
    parents, depths, tokens, ranks = ([int(x) for x in ints[i * m:(i + 1) * m]] for i in range(4))
    tree_index = {cid: i + 1 for i, cid in enumerate(kept)}
    nodes = []
    for cid, (parent, depth, token, conf, value, rank) in enumerate(
            zip(parents, depths, tokens, floats[:m], floats[m:], ranks)):
        ti = tree_index.get(cid)
        nodes.append(NodeRecord(cid + 1, parent + 1, depth, token, texts(token), conf, value, rank,
                                kept=ti is not None, accepted=ti in accepted if ti else False,
                                target_prob=node_probs[ti] if ti else None))
    return nodes


def _lookup_records(rnd: Round, m: int, first: int, accepted: set[int], node_probs: list[float],
                    texts: TokenTexts) -> list[NodeRecord]:
    """The prompt-lookup branch's nodes (tree indices first.., node ids m + 1..): a copy, not a draft, so
    confidence and value are 1 (the proposal is certain) and source says where they came from."""
    return [NodeRecord(m + 1 + j, 0 if j == 0 else m + j, j + 1, tok, texts(tok), 1.0, 1.0, 0, kept=True,
                       accepted=first + j in accepted, target_prob=node_probs[first + j], source="lookup")
            for j, tok in enumerate(rnd.lookup)]
