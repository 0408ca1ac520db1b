"""What each budget would accept: a calibration run drafts a large tree and records every candidate;
a replay reruns EAGLE-2's beam and rerank on the recorded candidates for each smaller budget
(AcceptModel: E[accept length] over the grid of total_tokens, depth, top_k and draft vocabulary)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ...core.config import DecodeConfig
from ...core.decode import Decoder, encode_prompt, generate
from ...models.head import AnyHead
from ...models.target import Target
from ...records.questions import load_questions
from ...records.trace import StepRecord
from .costs import CAL_DEPTH, CAL_TOP_K, CAL_TOTAL, DEPTHS, NS, TOP_KS


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


def samples_from_steps(steps: list[StepRecord]) -> list[StepSample]:
    """Every dynamic round (not the prefill), as replay samples."""
    out = []
    for step in steps:
        nodes = step.nodes[1:]  # node id = candidate index + 1; the root is node 0
        if step.step == 0 or step.mode != "dynamic" or not nodes:
            continue
        col = lambda f, dt: np.array([getattr(n, f) for n in nodes], dtype=dt)  # noqa: E731
        out.append(StepSample(col("parent", np.int64) - 1, col("rank", np.int64), col("depth", np.int64),
                              col("value", np.float64), col("token", np.int64), col("accepted", bool),
                              step.accept_length, float(sum(n.value for n in nodes if n.kept))))
    return out


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
    recorded rounds. vocab_masks: draft_vocab -> bool (V,) of the allowed tokens (None = all)."""

    def __init__(self, samples: list[StepSample], vocab_masks: dict[int, np.ndarray | None],
                 ns: tuple[int, ...] = NS, depths: tuple[int, ...] = DEPTHS,
                 top_ks: tuple[int, ...] = TOP_KS, method: str = "replay") -> None:
        if not samples:
            raise ValueError("calibration has no drafted rounds to learn from")
        if method not in ("replay", "value"):
            raise ValueError(f"method must be 'replay' or 'value', got {method!r}")
        self.ns, self.depths, self.top_ks, self.method = ns, depths, top_ks, method
        self.vocabs = tuple(vocab_masks)
        measured = np.mean([s.accept_length - 1 for s in samples])
        # value method: E = 1 + alpha * sum(kept values), alpha fitted on the recorded rounds
        self.alpha = measured / max(1e-9, float(np.mean([s.kept_value_sum for s in samples])))
        self.table = {(k, v): self._grid(samples, k, m) for k in top_ks for v, m in vocab_masks.items()}

    def _grid(self, samples: list[StepSample], top_k: int, allowed: np.ndarray | None) -> np.ndarray:
        ns, total = np.array(self.ns), np.zeros((len(self.depths), len(self.ns)))
        for s in samples:
            idx, rounds = _beam(s, _children(s), top_k, allowed, max(self.depths))
            if self.method == "replay":
                total += _accepts(s, idx, rounds, self.depths, ns)
            else:
                total += self._value_estimate(s, idx, rounds, ns)
        return total / len(samples)

    def _value_estimate(self, s: StepSample, idx: np.ndarray, rounds: np.ndarray, ns: np.ndarray) -> np.ndarray:
        out = np.ones((len(self.depths), ns.size))
        for i, depth in enumerate(self.depths):
            vals = np.sort(s.value[idx[rounds <= depth]])[::-1]
            cum = np.concatenate([[0.0], np.cumsum(vals)])
            out[i] += self.alpha * cum[np.minimum(ns - 1, vals.size)]
        return out

    def __call__(self, total_tokens: int, depth: int, top_k: int, draft_vocab: int = 0) -> float:
        grid = self.table[(top_k, draft_vocab)]
        return float(grid[self.depths.index(depth), self.ns.index(total_tokens)])

    def to_json(self) -> dict:
        """The replayed grid, so a cached report can choose again at another context length."""
        return {"ns": list(self.ns), "depths": list(self.depths), "top_ks": list(self.top_ks),
                "vocabs": list(self.vocabs), "grid": {f"{k}/{v}": g.tolist() for (k, v), g in self.table.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "AcceptModel":
        model = cls.__new__(cls)  # no samples to replay: the grid was computed from them already
        model.ns, model.depths, model.top_ks = tuple(d["ns"]), tuple(d["depths"]), tuple(d["top_ks"])
        model.vocabs, model.method, model.alpha = tuple(d["vocabs"]), "replay", math.nan
        model.table = {tuple(map(int, key.split("/"))): np.array(g) for key, g in d["grid"].items()}
        return model


def calibration_prompts(count: int = 3) -> list[str]:
    """First turns from the end of MT-bench (the bench's --limit runs start at the front)."""
    questions, _ = load_questions("mt_bench")
    return [q.turns[0] for q in questions[::-1][:: max(1, len(questions) // (count * 2))][:count]]


def calibrate(target: Target, head: AnyHead, prompts: list[str], max_new_tokens: int = 64,
              seed: int = 0) -> list[StepSample]:
    """Greedy decoding with a large tree, recorded as replay samples."""
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=max_new_tokens, total_tokens=CAL_TOTAL, depth=CAL_DEPTH,
                       top_k=CAL_TOP_K, seed=seed)
    samples: list[StepSample] = []
    for prompt in tqdm(prompts, desc="calibrate", unit="prompt", leave=False):
        ids = encode_prompt(target.tokenizer, prompt, target.max_context)
        g = generate(Decoder(target, head, cfg), ids)
        samples += samples_from_steps(g.steps)
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

