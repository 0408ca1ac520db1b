"""What each budget would accept: a calibration run drafts a large tree and records every candidate;
a replay reruns EAGLE-2's beam and rerank on the recorded candidates for each smaller budget
(AcceptModel: E[accept length] over the grid of total_tokens, depth, top_k and draft vocabulary).

With a prompt-lookup branch (eagle.core.lookup) the replay also copies: each recorded round knows its
context and the greedy continuation that followed, so how far the branch's copy would have matched is
known exactly; the round accepts the longer of the head's path and the copy, the branch as long as the
copy offered, up to the budget's longest, as the decoder verifies it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ...core.config import DecodeConfig
from ...core.decode import Decoder, generate
from ...core.prompt import encode_prompt
from ...core.lookup import find_continuation
from ...models.head import AnyHead
from ...models.target import Target
from ...records.questions import load_questions
from ...records.trace import StepRecord
from .costs import CAL_DEPTH, CAL_TOP_K, CAL_TOTAL, DEPTHS, NS, TOP_KS


@dataclass(frozen=True)
class Copies:
    """What a prompt-lookup copy offers at each position of a recorded reply (arrays (R + 1,), index =
    reply tokens already written): the tokens offered (up to COPY_MAX; 0: no n-gram recurs) and how
    many of them, in a row, the greedy reply then wrote."""
    proposed: np.ndarray
    match: np.ndarray


@dataclass
class StepSample:
    """One recorded round reduced to what a replay needs; arrays (M,) over drafted candidates."""
    parent: np.ndarray  # candidate index of the parent, -1 for children of the root
    rank: np.ndarray
    depth: np.ndarray  # 1 = child of the root
    value: np.ndarray  # EAGLE-2 value: product of draft confidences along the path
    token: np.ndarray
    on_path: np.ndarray  # accepted in the recorded round
    accept_length: int
    kept_value_sum: float  # sum of the values of the nodes the recorded round verified
    position: int = 0  # reply tokens written before the round
    copies: Copies | None = None  # its generation's (one object per generation; None: not known)


COPY_MAX = 64  # the longest prompt-lookup branch a DecodeConfig allows


def samples_from_steps(steps: list[StepRecord], prompt_ids: list[int] | None = None) -> list[StepSample]:
    """Every dynamic round (not the prefill) of one generation, as replay samples; with the prompt's
    ids also what a prompt-lookup copy would have offered at every position of the reply."""
    reply = [t for step in steps for t in step.new_tokens]
    copies = None if prompt_ids is None else copies_along(np.array([*prompt_ids, *reply]), len(reply))
    out, position = [], 0
    for step in steps:
        # node id = candidate index + 1 (the root is node 0); a lookup branch's nodes come after the head's
        nodes = [n for n in step.nodes[1:] if n.source == "draft"]
        if step.step > 0 and step.mode == "dynamic" and nodes:
            col = lambda f, dt: np.array([getattr(n, f) for n in nodes], dtype=dt)  # noqa: E731
            out.append(StepSample(col("parent", np.int64) - 1, col("rank", np.int64), col("depth", np.int64),
                                  col("value", np.float64), col("token", np.int64), col("accepted", bool),
                                  step.accept_length, float(sum(n.value for n in nodes if n.kept)), position,
                                  copies))
        position += len(step.new_tokens)
    return out


def copies_along(tokens: np.ndarray, reply_length: int) -> Copies:
    """Copies at every position of the reply that ends `tokens` (prompt then reply)."""
    start = tokens.shape[0] - reply_length
    proposed, match = np.zeros(reply_length + 1, dtype=np.int64), np.zeros(reply_length + 1, dtype=np.int64)
    for r in range(reply_length + 1):
        copy = np.array(find_continuation(tokens[:start + r], COPY_MAX), dtype=np.int64)
        ahead = tokens[start + r:start + r + copy.shape[0]]
        proposed[r] = copy.shape[0]
        match[r] = int(np.cumprod(copy[:ahead.shape[0]] == ahead).sum())  # equal in a row from the first
    return Copies(proposed, match)


def _children(s: StepSample) -> dict[int, np.ndarray]:
    """parent -> its recorded children, best rank first."""
    order = np.lexsort((s.rank, s.parent))  # by parent, then rank
    groups = np.split(order, np.flatnonzero(np.diff(s.parent[order])) + 1)
    return {int(s.parent[g[0]]): g for g in groups if g.size}


def _beam(s: StepSample, kids: dict[int, np.ndarray], top_k: int, allowed: np.ndarray | None,
          max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """EAGLE-2's expansion replayed on the recorded candidates: the candidates a (max_depth, top_k)
    draft would have produced, with the expansion round that produced each (0 = the root's)."""
    def children(p: int) -> np.ndarray:
        c = kids.get(p, np.empty(0, dtype=np.int64))
        return (c if allowed is None else c[allowed[s.token[c]]])[:top_k]
    level = children(-1)
    picked, rounds = [level], [np.zeros(level.size, dtype=np.int64)]
    for d in range(1, max_depth + 1):
        frontier = level[np.argsort(-s.value[level], kind="stable")[:top_k]]
        level = np.concatenate([children(int(p)) for p in frontier]) if frontier.size else frontier
        if not level.size:
            break
        picked.append(level)
        rounds.append(np.full(level.size, d, dtype=np.int64))
    return np.concatenate(picked), np.concatenate(rounds)


def _accepts(s: StepSample, idx: np.ndarray, rounds: np.ndarray, depths: tuple[int, ...],
             ns: np.ndarray) -> np.ndarray:
    """(len(depths), len(ns)) accepted length of each budget: rerank keeps the n-1 best values
    (shallower first on ties), and the accepted path nodes among them count."""
    out = np.ones((len(depths), ns.size))
    for i, depth in enumerate(depths):
        sel = idx[rounds <= depth]
        order = sel[np.lexsort((s.depth[sel], -s.value[sel]))]
        positions = np.flatnonzero(s.on_path[order])  # ranks of the accepted path nodes
        out[i] += np.searchsorted(positions, ns - 1, side="left")
    return out


class AcceptModel:
    """E[accepted length] over a grid of (total_tokens, depth, top_k, draft_vocab), from replays of
    recorded rounds. vocab_masks: draft_vocab -> bool (V,) of the allowed tokens (None = all).
    lookup_tokens > 0: each budget with a prompt-lookup branch of up to that many tokens beside its
    tree, walked along each recorded reply (_walk; the samples must know their copies:
    samples_from_steps with the prompt's ids), and lookup_nodes(...) the branch's mean size, which the
    verify forward also pays for."""

    def __init__(self, samples: list[StepSample], vocab_masks: dict[int, np.ndarray | None],
                 ns: tuple[int, ...] = NS, depths: tuple[int, ...] = DEPTHS,
                 top_ks: tuple[int, ...] = TOP_KS, method: str = "replay", lookup_tokens: int = 0) -> None:
        if not samples:
            raise ValueError("calibration has no drafted rounds to learn from")
        if method not in ("replay", "value") or (method == "value" and lookup_tokens):
            raise ValueError(f"method must be 'replay' (or 'value' without a lookup branch), got {method!r}")
        self.ns, self.depths, self.top_ks, self.method = ns, depths, top_ks, method
        self.vocabs, self.lookup_tokens = tuple(vocab_masks), lookup_tokens
        measured = np.mean([s.accept_length - 1 for s in samples])
        # value method: E = 1 + alpha * sum(kept values), alpha fitted on the recorded rounds
        self.alpha = measured / max(1e-9, float(np.mean([s.kept_value_sum for s in samples])))
        grids = {(k, v): self._grid(samples, k, m) for k in top_ks for v, m in vocab_masks.items()}
        self.table = {key: accept for key, (accept, _, _) in grids.items()}
        self.copy_table = {key: nodes for key, (_, nodes, _) in grids.items()}
        self.share_table = {key: share for key, (_, _, share) in grids.items()}

    def _grid(self, samples: list[StepSample], top_k: int,
              allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(E[accept length], E[lookup-branch nodes per round], the share of rounds with a branch), each
        (len(depths), len(ns))."""
        ns, per_round = np.array(self.ns), []
        for s in samples:
            idx, rounds = _beam(s, _children(s), top_k, allowed, max(self.depths))
            per_round.append(self._value_estimate(s, idx, rounds, ns) if self.method == "value"
                             else _accepts(s, idx, rounds, self.depths, ns))
        if not self.lookup_tokens:  # a round's accept length does not depend on where the rounds start
            return np.mean(per_round, axis=0), np.zeros_like(per_round[0]), np.zeros_like(per_round[0])
        # with copies it does: a long copy is one round of the decoder but many recorded rounds
        totals = sum(_walk(np.stack([per_round[i] for i in gen]), [samples[i] for i in gen], self.lookup_tokens)
                     for gen in _generations(samples))
        return totals[0] / totals[1], totals[2] / totals[1], totals[3] / totals[1]

    def _value_estimate(self, s: StepSample, idx: np.ndarray, rounds: np.ndarray, ns: np.ndarray) -> np.ndarray:
        out = np.ones((len(self.depths), ns.size))
        for i, depth in enumerate(self.depths):
            vals = np.sort(s.value[idx[rounds <= depth]])[::-1]
            cum = np.concatenate([[0.0], np.cumsum(vals)])
            out[i] += self.alpha * cum[np.minimum(ns - 1, vals.size)]
        return out

    def _at(self, table: dict, total_tokens: int, depth: int, top_k: int, draft_vocab: int) -> float:
        """One budget's entry of a replayed table (grids by top_k/vocab, rows depths, columns sizes)."""
        return float(table[(top_k, draft_vocab)][self.depths.index(depth), self.ns.index(total_tokens)])

    def __call__(self, total_tokens: int, depth: int, top_k: int, draft_vocab: int = 0) -> float:
        return self._at(self.table, total_tokens, depth, top_k, draft_vocab)

    def lookup_nodes(self, total_tokens: int, depth: int, top_k: int, draft_vocab: int = 0) -> float:
        """The mean number of prompt-lookup nodes a round of this budget verifies beside its tree."""
        return self._at(self.copy_table, total_tokens, depth, top_k, draft_vocab)

    def lookup_share(self, total_tokens: int, depth: int, top_k: int, draft_vocab: int = 0) -> float:
        """The share of this budget's rounds that verify a prompt-lookup branch at all: its nodes come in
        a few rounds, and a verify's cost is not linear in its size (Costs.round_cost)."""
        return self._at(self.share_table, total_tokens, depth, top_k, draft_vocab)

    def to_json(self) -> dict:
        """The replayed grids, so a cached report can choose again at another context length."""
        as_json = lambda table: {f"{k}/{v}": g.tolist() for (k, v), g in table.items()}  # noqa: E731
        return {"ns": list(self.ns), "depths": list(self.depths), "top_ks": list(self.top_ks),
                "vocabs": list(self.vocabs), "grid": as_json(self.table), "lookup_tokens": self.lookup_tokens,
                "lookup_grid": as_json(self.copy_table), "lookup_share_grid": as_json(self.share_table)}

    @classmethod
    def from_json(cls, d: dict) -> "AcceptModel":
        model = cls.__new__(cls)  # no samples to replay: the grid was computed from them already
        model.ns, model.depths, model.top_ks = tuple(d["ns"]), tuple(d["depths"]), tuple(d["top_ks"])
        model.vocabs, model.method, model.alpha = tuple(d["vocabs"]), "replay", math.nan
        model.lookup_tokens = int(d.get("lookup_tokens", 0))
        as_table = lambda grids: {tuple(map(int, key.split("/"))): np.array(g) for key, g in grids.items()}  # noqa: E731
        model.table = as_table(d["grid"])
        model.copy_table = as_table(d["lookup_grid"]) if "lookup_grid" in d else \
            {key: np.zeros_like(g) for key, g in model.table.items()}
        # without the shares: every round verifies the mean branch (the older reports' model)
        model.share_table = as_table(d["lookup_share_grid"]) if "lookup_share_grid" in d else \
            {key: np.ones_like(g) for key, g in model.table.items()}
        return model


def _generations(samples: list[StepSample]) -> list[list[int]]:
    """The samples' indices grouped by generation (consecutive samples sharing one Copies)."""
    groups: list[list[int]] = []
    for i, s in enumerate(samples):
        if s.copies is None:
            raise ValueError("a replay with a lookup branch needs what it would copy: samples_from_steps with "
                             "the prompt's ids")
        if groups and samples[groups[-1][0]].copies is s.copies:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _walk(head: np.ndarray, samples: list[StepSample], longest: int) -> np.ndarray:
    """One generation decoded again by every budget with a lookup branch of up to `longest` tokens, as
    the decoder would: from the first recorded round's position, a round accepts the longer of the
    head's path (the recorded round at or before the position stands in for the head there) and the
    copy offered at the position (known exactly) and moves on by what it accepted.
    head: (S, D, N) the recorded rounds' accept lengths per budget. Returns (4, D, N): the accepted
    tokens, the rounds, the lookup nodes verified and the rounds that verified a branch, summed over
    the generation."""
    copies, starts = samples[0].copies, np.array([s.position for s in samples])
    end, shape = copies.proposed.shape[0] - 1, head.shape[1:]  # the reply's length; (depths, ns)
    rows, cols = np.indices(shape)
    position = np.full(shape, starts[0])
    out = np.zeros((4, *shape))
    while (active := position < end).any():
        at = np.minimum(position, end)
        drafted = head[np.searchsorted(starts, at, side="right") - 1, rows, cols] - 1
        proposed, copied = np.minimum(longest, copies.proposed[at]), np.minimum(longest, copies.match[at])
        accept = 1 + np.maximum(drafted, copied)  # on a tie acceptance keeps the first longest path: the head's
        out += active * np.stack([accept, np.ones(shape), proposed, proposed > 0])
        position = position + np.where(active, accept, 0).astype(np.int64)
    return out


# Acceptance varies from prompt to prompt (1.7 to 6.0 tokens a round at 4/1/2/8192 + lookup on these 16,
# 2026-12-07): the last question of each category alone put it at 2.28, the one before at 2.05, all
# 16 at 2.15, where a bench of the first two of each (128 tokens) measured 2.20.
CALIBRATION_PER_CATEGORY = 2


def calibration_prompts(count: int = 8 * CALIBRATION_PER_CATEGORY) -> list[str]:
    """The first turn of the last CALIBRATION_PER_CATEGORY questions of each MT-bench category, up to
    `count`: the last of each category first, then the one before (bench's --limit and --per-category
    runs take the first ones). The copying categories (extraction, coding) weigh in as much as the
    rest, which a prompt-lookup branch's payoff depends on."""
    questions, _ = load_questions("mt_bench")
    by_category: dict[str, list] = {}
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    rounds = [[qs[-1 - i] for qs in by_category.values() if len(qs) > i] for i in range(CALIBRATION_PER_CATEGORY)]
    return [q.turns[0] for r in rounds for q in r][:count]


def calibrate(target: Target, head: AnyHead, prompts: list[str], max_new_tokens: int = 64,
              seed: int = 0) -> list[StepSample]:
    """Greedy decoding with a large tree and no lookup branch, recorded as replay samples (with what a
    lookup branch would have copied at each round: the replay adds it where a budget has one)."""
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=max_new_tokens, total_tokens=CAL_TOTAL, depth=CAL_DEPTH,
                       top_k=CAL_TOP_K, seed=seed, lookup_tokens=0)
    samples: list[StepSample] = []
    for prompt in tqdm(prompts, desc="calibrate", unit="prompt", leave=False):
        ids = encode_prompt(target.tokenizer, prompt, target.max_context)
        g = generate(Decoder(target, head, cfg), ids)
        samples += samples_from_steps(g.steps, ids)
    return samples


def vocab_masks(head: AnyHead, vocabs: tuple[int, ...]) -> dict[int, np.ndarray | None]:
    """The draft vocabularies this head supports (it needs token counts for a subset)."""
    out: dict[int, np.ndarray | None] = {0: None}
    for v in vocabs:
        ids = head.draft_vocab_ids(v) if v else None
        if ids is not None:
            mask = np.zeros(head.config.vocab_size, dtype=bool)
            mask[ids.cpu().numpy()] = True
            out[v] = mask
    return out

