"""A hardware-tuned tree budget: measure what a round costs on this machine, estimate what each budget
would accept from recorded draft trees, and pick the budget with the most expected tokens per second.

    expected tokens/s (n, depth, top_k, vocab) = E[accept length] / (t_verify(n) + t_draft(depth, top_k, vocab)
                                                                       + per-round overhead + host)

Costs are measured with the decoder's own functions (target forward + softmax for verification;
eagle.core.decode.draft_round, a round's draft + rerank + tree building + trace bookkeeping, for drafting)
and cached per model, torch thread count and device under $EAGLE_CACHE (default
~/.cache/eagle2-explorer/costs/). The probes run their parts in tight loops, with warm caches; a real
round interleaves them with the target's forward, which evicts the draft head's weights, and adds the
acceptance and record keeping. That difference, `host`, is measured once per report by decoding a
calibration prompt with the chosen tree and with plain decoding (see host_terms). A generation's time
adds the prefill of its prompt (measured at two lengths, linear between): expected_seconds.

E[accept length] comes from a *replay*: a calibration run drafts a large tree (depth CAL_DEPTH,
top_k CAL_TOP_K, CAL_TOTAL verified nodes) and records every candidate's value and whether it was
accepted. For a smaller budget we rerun EAGLE-2's beam and rerank on the recorded candidates; the
accepted length is 1 + the accepted path nodes that survive. That is exact whenever the smaller tree's
verified nodes are a subset of the recorded ones (greedy), and a lower bound otherwise. The EAGLE-2
paper's shortcut, 1 + alpha * (sum of kept values) with alpha fitted on the same run, is the
`method="value"` alternative.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from ..records.stats import speedup, tokens_per_second
from ..core.adaptive import RoundCosts, interpolate
from ..core.config import DecodeConfig
from ..core.decode import Decoder, Drafter, TokenTexts, draft_round, encode_prompt, generate, new_drafter
from ..records.files import atomic_write_json, read_json_or_none
from ..records.schema import FileFormatError, check_in, check_object, check_value, fail, is_kind
from ..models.head import AnyHead, DraftHead
from ..models.target import Target, cache_dir, choose_cpu_dtype, device_name, dtype_name
from ..records.questions import load_questions
from ..records.timing import time_interleaved
from ..records.trace import StepRecord

# Dense at small n: on the 2-core CPU, MKL's fp32 matmul costs about the same for 1-3 rows and steps up
# at 4 (t(3) = 83 ms, t(4) = 108), a step that interpolation between sparse points would hide.
NS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
TOP_KS = (1, 2, 4, 6, 8, 10)
VOCABS = (0, 32768, 16384, 8192, 4096)
CAL_DEPTH, CAL_TOP_K, CAL_TOTAL = 7, 10, 64  # the calibration tree: covers every budget searched
# Depth 0 drafts the root's children and stops: for the tiny CPU trees it saves a head forward a round.
DEPTHS = tuple(range(0, CAL_DEPTH + 1))
PREFIX_LEN = 192  # a typical MT-bench prefix mid-answer (prompt ~60-120 tokens + part of the answer)
DEPTH_PROBE = 4  # draft costs are measured at depth 1 and this depth, then taken as linear in depth
# Verify is also timed over these prefixes: a 700-900-token summarisation prompt makes every tree token
# dearer than MT-bench's ~200, and a budget tuned at 192 alone ran at 0.82x vanilla there.
CONTEXTS = (PREFIX_LEN, 768, 2048)
PREFILL_LENS = (32, PREFIX_LEN)  # prompt lengths the prefill is timed at (linear between and past)
HOST_TOKENS = 32  # tokens decoded (twice: the first run warms up) to measure the host terms
COSTS_VERSION = 3
AUTO_REPORT_VERSION = 5  # bump when the report or the searched grid changes: cached reports are then recomputed


# ---- measured costs ---------------------------------------------------------------------------
@dataclass
class Costs:
    key: str
    verify: dict[int, float]  # n tree tokens -> seconds (forward over a PREFIX_LEN prefix + softmax)
    draft: dict[str, tuple[float, float]]  # "top_k/vocab" -> (base s, s per expansion)
    overhead: float  # per round: the draft head consumes the accepted tokens, the KV cache commits
    meta: dict = field(default_factory=dict)
    # context length -> {n -> seconds}: verify over longer prefixes (attention grows with the context)
    verify_by_context: dict[int, dict[int, float]] = field(default_factory=dict)
    prefill: dict[int, float] = field(default_factory=dict)  # prompt tokens -> s (target forward + draft consume)
    host_tree: float = 0.0  # s per drafted round that a real decode spends beyond the probes (host_terms)
    host_plain: float = 0.0  # the same per plain-decoding round

    def t_verify(self, n: int, context: int | None = None) -> float:
        """Piecewise-linear in n (and in the context length, when measured at several)."""
        if context is None or len(self.verify_by_context) < 2:
            return interpolate(self.verify, n)
        return interpolate({c: interpolate(t, n) for c, t in self.verify_by_context.items()}, context)

    def t_draft(self, depth: int, top_k: int, vocab: int = 0) -> float:
        base, step = self.draft[f"{top_k}/{vocab}"]
        return base + depth * step

    def round_cost(self, n: int, depth: int, top_k: int, vocab: int = 0, context: int | None = None) -> float:
        """Seconds per round; a 1-node tree is plain decoding (no draft)."""
        if n == 1:
            return self.t_plain(context)
        round_s = self.t_verify(n, context) + self.t_draft(depth, top_k, vocab) + self.overhead + self.host_tree
        return max(round_s, 0.5 * self.t_verify(n, context))  # a negative host term: a sanity floor

    def t_plain(self, context: int | None = None) -> float:
        """Seconds per token of plain decoding."""
        return max(self.t_verify(1, context) + self.host_plain, 0.5 * self.t_verify(1, context))

    def t_prefill(self, prompt_tokens: int) -> float:
        return interpolate(self.prefill, prompt_tokens) if self.prefill else 0.0

    def to_json(self) -> dict:
        by_context = {str(c): {str(n): t for n, t in v.items()} for c, v in self.verify_by_context.items()}
        return {"version": COSTS_VERSION, **asdict(self), "verify": {str(k): v for k, v in self.verify.items()},
                "verify_by_context": by_context, "prefill": {str(k): v for k, v in self.prefill.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "Costs":
        by_context = {int(c): {int(n): float(t) for n, t in v.items()} for c, v in d.get("verify_by_context", {}).items()}
        return cls(d["key"], {int(k): float(v) for k, v in d["verify"].items()},
                   {k: (float(v[0]), float(v[1])) for k, v in d["draft"].items()}, float(d["overhead"]),
                   d.get("meta", {}), by_context, {int(k): float(v) for k, v in d.get("prefill", {}).items()},
                   float(d.get("host_tree", 0.0)), float(d.get("host_plain", 0.0)))

    def covers(self, ns: tuple[int, ...], top_ks: tuple[int, ...], vocabs: tuple[int, ...],
               contexts: tuple[int, ...] = ()) -> bool:
        return set(ns) <= set(self.verify) and all(f"{k}/{v}" in self.draft for k in top_ks for v in vocabs) \
            and set(contexts) <= set(self.verify_by_context)


def cost_key(target: Target, head: AnyHead) -> str:
    """Costs are the machine's, the target's and the head's shape: every EAGLE-1/2 head of a target
    drafts at the same cost; an EAGLE-3 head's cost is its own vocabulary's width."""
    shape = "eagle1" if isinstance(head, DraftHead) else f"eagle3-{head.d2t.numel()}"
    return f"{target.name}|threads={torch.get_num_threads()}|{device_name(target.device)}|{target.dtype}|{shape}"


def cost_path(key: str) -> Path:
    return cache_dir() / "costs" / (re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:180] + ".json")


def load_costs(key: str) -> Costs | None:
    """The cached costs of `key`, or None (measured again) when missing, stale or malformed."""
    path = cost_path(key)
    d = read_json_or_none(path)
    if d is None or d.get("version") != COSTS_VERSION or d.get("key") != key:
        return None
    try:
        return Costs.from_json(check_costs(d, path))
    except FileFormatError:
        return None


COSTS_KINDS = {"version": "int", "key": "str", "verify": "dict", "draft": "dict", "overhead": "nonneg"}
# the host terms are signed: a real round may cost less than the probes' sum (a probe runs cold where a
# decode reuses a warm buffer), and the model then subtracts the difference
COSTS_OPTIONAL = {"meta": "dict", "verify_by_context": "dict", "prefill": "dict", "host_tree": "num",
                  "host_plain": "num"}


def check_costs(d: dict, path: str | Path, what: str = "costs") -> dict:
    """A cost cache: seconds >= 0 by token count (verify, prefill, verify over each context), and
    (base, per expansion) seconds by "top_k/vocab" (draft)."""
    check_object(d, path, what, COSTS_KINDS, COSTS_OPTIONAL)
    _check_seconds(d["verify"], path, f"{what} field 'verify'")
    _check_seconds(d.get("prefill", {}), path, f"{what} field 'prefill'", empty=True)
    for context, by_n in d.get("verify_by_context", {}).items():
        _check_count(context, path, f"{what} field 'verify_by_context'")
        check_value(by_n, path, f"{what} field 'verify_by_context' {context!r}", "dict")
        _check_seconds(by_n, path, f"{what} field 'verify_by_context' {context!r}")
    for shape, pair in d["draft"].items():
        if not re.fullmatch(r"[0-9]+/[0-9]+", shape):
            fail(path, f"{what} field 'draft'", f"has the key {shape!r:.40}, not top_k/vocab")
        if not (isinstance(pair, list) and len(pair) == 2 and all(is_kind(v, "nonneg") for v in pair)):
            fail(path, f"{what} field 'draft' {shape!r}", f"is {pair!r:.40}, not two seconds >= 0")
    return d


def _check_count(key: str, path: str | Path, field: str) -> int:
    if not (key.isdigit() and key.isascii() and int(key) > 0):
        fail(path, field, f"has the key {key!r:.40}, not a token count")
    return int(key)


def _check_seconds(by_n: dict, path: str | Path, field: str, empty: bool = False) -> None:
    if not by_n and not empty:
        fail(path, field, "is empty (no time measured)")
    for n, seconds in by_n.items():
        _check_count(n, path, field)
        check_value(seconds, path, f"{field} {n!r}", "nonneg")


def save_costs(costs: Costs) -> Path:
    path = cost_path(costs.key)
    atomic_write_json(path, costs.to_json(), indent=1)
    return path


class _Probe:
    """A prefix in the target's and the draft's caches, to time rounds at a realistic length."""

    def __init__(self, target: Target, head: AnyHead, prefix_len: int, max_n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        vocab = int(target.config.vocab_size)
        ids = torch.randint(0, vocab, (1, prefix_len), generator=g).to(target.device)
        self.target, self.head, self.prefix_len = target, head, prefix_len
        self.cache = target.new_cache(prefix_len + max_n + 8)
        _, self.features = target.forward(ids, torch.arange(prefix_len, device=target.device)[None], self.cache, 0,
                                          logits_rows=slice(-1, None), feature_layers=head.feature_layers)
        self.cache.length = prefix_len
        self.ids, self.texts = ids[0], TokenTexts(target.tokenizer)

    def verify(self, n: int) -> Callable[[], None]:
        tokens = self.ids[:n][None]
        positions = (self.prefix_len + torch.arange(n, device=tokens.device))[None]
        mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril_()

        def run() -> None:
            logits, _ = self.target.forward(tokens, positions, self.cache, self.prefix_len, mask if n > 1 else None)
            torch.softmax(logits[0].float(), dim=-1)  # the decoder's acceptance computes this too
        return run

    def drafter(self, top_k: int, vocab: int, depth: int) -> tuple[Drafter, torch.Tensor]:
        # stand_in: a head without token counts (a random head) cannot pick its subset, but the cost
        # depends only on the subset's size, so the first `vocab` ids stand in
        d = new_drafter(self.target, self.head, self.prefix_len + depth * top_k + 8, vocab, stand_in=True)
        root_hidden = d.consume(self.ids[1:], self.features[0, :-1])
        return d, root_hidden

    def draft(self, top_k: int, vocab: int, depth: int) -> Callable[[], None]:
        drafter, root_hidden = self.drafter(top_k, vocab, depth)

        def run() -> None:
            with torch.inference_mode():  # a 16-node tree (rerank keeps at most the drafted candidates)
                draft_round(drafter, root_hidden, int(self.ids[0]), depth, top_k, 16, self.texts)
        return run

    def prefill(self, p: int) -> Callable[[], None]:
        """A prompt of p tokens from empty caches: the target's forward and the draft head's consume."""
        ids, cache = self.ids[:p], self.target.new_cache(p + 1)
        positions = torch.arange(p, device=ids.device)[None]
        drafter = new_drafter(self.target, self.head, p + 1)

        def run() -> None:
            cache.length = drafter.cache.length = 0
            _, features = self.target.forward(ids[None], positions, cache, 0, logits_rows=slice(-1, None),
                                              feature_layers=self.head.feature_layers)
            drafter.consume(ids[1:], features[0, :-1])
        return run

    def overhead(self) -> Callable[[], None]:
        drafter, _ = self.drafter(1, 0, 1)
        start = drafter.cache.length

        def run() -> None:  # a typical round commits ~3 tokens
            drafter.cache.length = start
            drafter.consume(self.ids[:3], self.features[0, :3])
            self.cache.commit(torch.arange(self.prefix_len, self.prefix_len + 3, device=self.ids.device))
            self.cache.length = self.prefix_len
        return run


def _fitting_contexts(target: Target, contexts: tuple[int, ...], max_n: int) -> tuple[int, ...]:
    """The context lengths whose probe fits in the model's context (a tiny test model has little)."""
    return tuple(c for c in contexts if c + max_n + 8 <= target.max_context)


def _measure(target: Target, head: AnyHead, ns: tuple[int, ...], top_ks: tuple[int, ...],
             vocabs: tuple[int, ...], repeats: int, prefix_len: int, contexts: tuple[int, ...] = ()) -> Costs:
    probe = _Probe(target, head, prefix_len, max(ns))
    jobs = {f"v{n}": probe.verify(n) for n in ns}
    longer = [c for c in _fitting_contexts(target, contexts, max(ns)) if c != prefix_len]
    for c in longer:
        long_probe = _Probe(target, head, c, max(ns))
        jobs.update({f"v{n}@{c}": long_probe.verify(n) for n in ns})
    for k in top_ks:
        for v in vocabs:
            jobs[f"d{k}/{v}@1"] = probe.draft(k, v, 1)
            jobs[f"d{k}/{v}@{DEPTH_PROBE}"] = probe.draft(k, v, DEPTH_PROBE)
    jobs["overhead"] = probe.overhead()
    prefill_lens = sorted({min(p, prefix_len) for p in PREFILL_LENS})
    jobs.update({f"p{p}": probe.prefill(p) for p in prefill_lens})
    with torch.inference_mode():
        t = time_interleaved(jobs, repeats, "measure costs")
    draft = {}
    for k in top_ks:
        for v in vocabs:
            t1, t4 = t[f"d{k}/{v}@1"], t[f"d{k}/{v}@{DEPTH_PROBE}"]
            step = max(0.0, (t4 - t1) / (DEPTH_PROBE - 1))  # noise can make it negative for tiny models
            draft[f"{k}/{v}"] = (max(0.0, t1 - step), step)
    verify = {n: t[f"v{n}"] for n in ns}
    by_context = {prefix_len: verify, **{c: {n: t[f"v{n}@{c}"] for n in ns} for c in longer}} if longer else {}
    meta = {"prefix_len": prefix_len, "repeats": repeats, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    return Costs(cost_key(target, head), verify, draft, t["overhead"], meta, by_context,
                 {p: t[f"p{p}"] for p in prefill_lens})


STALE_RATIO = 1.5  # a cached t(1) this much slower than a fresh probe was measured under load


def probe_t1(target: Target, head: AnyHead, prefix_len: int = PREFIX_LEN, repeats: int = 5) -> float:
    """A quick (~1 s) timing of a one-token verify, to check a cached measurement against."""
    probe = _Probe(target, head, prefix_len, 1)
    with torch.inference_mode():
        return time_interleaved({"v1": probe.verify(1)}, repeats, "check costs")["v1"]


def measured_under_load(cached_t1: float, fresh_t1: float) -> bool:
    """True when the cache is much slower than this machine is now: it was timed while other work
    shared the cores, so its choice is wrong. The opposite (slower now) keeps the cache: the least
    loaded measurement is the better reference."""
    return cached_t1 > STALE_RATIO * fresh_t1


def measure_costs(target: Target, head: AnyHead, ns: tuple[int, ...] = NS, top_ks: tuple[int, ...] = TOP_KS,
                  vocabs: tuple[int, ...] = VOCABS, repeats: int = 5, prefix_len: int = PREFIX_LEN,
                  refresh: bool = False, contexts: tuple[int, ...] = CONTEXTS) -> Costs:
    """Verify cost t(n) and draft costs on this machine, from the cache when it covers the request.
    Keyed by model name, torch threads, device name, dtype and head shape (cost_key: every EAGLE-1/2
    head of a target drafts at the same cost, an EAGLE-3 head at its own vocabulary's)."""
    key = cost_key(target, head)
    cached = None if refresh else load_costs(key)
    fitting = _fitting_contexts(target, contexts, max(ns))
    if cached is not None and cached.covers(ns, top_ks, vocabs, fitting if len(fitting) > 1 else ()) and \
            not measured_under_load(cached.t_verify(1), probe_t1(target, head, prefix_len)):
        return cached
    costs = _measure(target, head, ns, top_ks, vocabs, repeats, prefix_len, contexts)
    costs.meta["file"] = str(save_costs(costs))
    return costs


# ---- calibration: what each budget would accept ---------------------------------------------
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


# ---- the choice -------------------------------------------------------------------------------
def choose_budget(costs: Costs, model: Callable[[int, int, int, int], float], draft_vocab: int = 0,
                  ns: tuple[int, ...] | None = None, depths: tuple[int, ...] | None = None,
                  top_ks: tuple[int, ...] | None = None,
                  context: int | None = None) -> tuple[int, int, int, list[dict]]:
    """The (total_tokens, depth, top_k) with the most expected tokens/s for one draft vocabulary
    at a context length (None: the reference prefix), and the whole table, best first.
    `model(n, depth, top_k, vocab)` gives E[accepted length]; a budget must fit in the candidates
    its draft produces (top_k + depth * top_k^2)."""
    ns = ns or getattr(model, "ns", NS)
    depths = depths or getattr(model, "depths", DEPTHS)
    top_ks = top_ks or getattr(model, "top_ks", TOP_KS)
    vanilla = tokens_per_second(1, costs.t_plain(context))  # plain decoding: a token per forward
    rows = []
    for n in (x for x in ns if x > 1):
        for depth in depths:
            for k in top_ks:
                if n - 1 > k + depth * k * k:
                    continue
                accept, cost = model(n, depth, k, draft_vocab), costs.round_cost(n, depth, k, draft_vocab, context)
                rows.append({"total_tokens": n, "depth": depth, "top_k": k, "draft_vocab": draft_vocab,
                             "accept_length": accept, "round_s": cost,
                             "tokens_per_s": tokens_per_second(accept, cost),
                             "speedup": speedup(tokens_per_second(accept, cost), vanilla)})
    if not rows:
        raise ValueError("no budget in the grid fits: give total_tokens above 1")
    rows.sort(key=lambda r: (-r["tokens_per_s"], r["total_tokens"], r["depth"], r["top_k"]))
    best = rows[0]
    return best["total_tokens"], best["depth"], best["top_k"], rows


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


def host_terms(target: Target, head: AnyHead, costs: Costs, chosen: dict, prompt_ids: list[int],
               max_new_tokens: int = HOST_TOKENS) -> Costs:
    """costs with host_tree and host_plain: the mean seconds per round that real decoding of the prompt
    spends beyond the modelled round (probes time their parts in tight loops with warm caches; a real
    round interleaves them with the target's forward and adds acceptance and record keeping). Measured
    at the chosen tree and with plain decoding, each the second of two runs (the first warms up)."""
    base = replace(costs, host_tree=0.0, host_plain=0.0)
    tree = DecodeConfig(mode="dynamic", max_new_tokens=max_new_tokens, **{k: chosen[k] for k in BUDGET_KEYS})
    plain = tree.with_(mode="vanilla")
    return replace(base, host_tree=_extra_per_round(target, head, base, tree, prompt_ids),
                   host_plain=_extra_per_round(target, head, base, plain, prompt_ids))


def _extra_per_round(target: Target, head: AnyHead, costs: Costs, cfg: DecodeConfig, prompt_ids: list[int]) -> float:
    """Mean of (measured - modelled) seconds over the rounds of a decode, each modelled at its own tree
    size and context length."""
    steps = [generate(Decoder(target, head, cfg), prompt_ids) for _ in range(2)][-1].steps
    context, extra = len(prompt_ids), []
    for s in steps:
        if s.step > 0:
            n = max(1, sum(node.kept for node in s.nodes))  # the verified tree, root included
            modelled = costs.round_cost(n, cfg.depth, cfg.top_k, cfg.draft_vocab, context)
            extra.append(sum(s.timings.values()) - modelled)
        context += len(s.new_tokens)
    return float(np.mean(extra)) if extra else 0.0


def expected_seconds(report: dict, prompt_tokens: int, new_tokens: int) -> float:
    """The cost model's wall time for one generation with the report's chosen budget: the prompt's
    prefill, then (new_tokens - 1) / E[accept length] rounds at the generation's mean context length."""
    costs, c = Costs.from_json(report["costs"]), report["chosen"]
    rounds = max(0, new_tokens - 1) / report["expected_accept_length"]
    round_s = costs.round_cost(c["total_tokens"], c["depth"], c["top_k"], c["draft_vocab"],
                               prompt_tokens + new_tokens // 2)
    return costs.t_prefill(prompt_tokens) + rounds * round_s


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


def head_fingerprint(head: AnyHead) -> str:
    """A short hash of the head's weights: a retrained head gets a new auto budget."""
    return hashlib.sha1(head.fc.weight.detach().float().cpu().numpy().tobytes()).hexdigest()[:12]


def _auto_report(target: Target, head: AnyHead, prompts: list[str] | None, vocabs: tuple[int, ...],
                 repeats: int, max_new_tokens: int, ns: tuple[int, ...], top_ks: tuple[int, ...],
                 refresh: bool = False) -> dict:
    masks = vocab_masks(head, vocabs)
    costs = measure_costs(target, head, ns=ns, top_ks=top_ks, vocabs=tuple(masks), repeats=repeats,
                          refresh=refresh)
    prompts = prompts or calibration_prompts()
    samples = calibrate(target, head, prompts, max_new_tokens)
    model = AcceptModel(samples, masks, ns=ns, top_ks=top_ks)
    first = _best_table(costs, model, None)[0][0]
    costs = host_terms(target, head, costs, first, encode_prompt(target.tokenizer, prompts[0], target.max_context))
    table, choices = _best_table(costs, model, None)
    best = table[0]
    by_context = [{"context": c, **{k: _best_table(costs, model, c)[0][0][k] for k in (*BUDGET_KEYS, "speedup")}}
                  for c in sorted(costs.verify_by_context)]
    same_shape = [r for r in table if (r["depth"], r["top_k"]) == (best["depth"], best["top_k"])]
    return {"curve": sorted(same_shape, key=lambda r: r["total_tokens"]),
            "vanilla_tokens_per_s": tokens_per_second(1, costs.t_plain()), "t_plain": costs.t_plain(),
            "t_verify": {str(n): costs.t_verify(n) for n in ns}, "alpha": model.alpha,
            "host_ms": {"tree": 1000 * costs.host_tree, "plain": 1000 * costs.host_plain},
            "chosen": {f: best[f] for f in BUDGET_KEYS},
            "expected_tokens_per_s": best["tokens_per_s"], "expected_speedup": best["speedup"],
            "expected_accept_length": best["accept_length"], "beats_vanilla": best["speedup"] > 1.0,
            "calibration_rounds": len(samples),
            "calibration_accept_length": float(np.mean([s.accept_length for s in samples])),
            "costs_key": costs.key, "costs_file": str(cost_path(costs.key)),
            "best_per_vocab": sorted((t[0] for t in choices), key=lambda r: -r["tokens_per_s"]), "top": table[:5],
            "by_context": by_context, "costs": costs.to_json(), "accept_table": model.to_json()}


BUDGET_KEYS = ("total_tokens", "depth", "top_k", "draft_vocab")


def _best_table(costs: Costs, model: AcceptModel, context: int | None) -> tuple[list[dict], list[list[dict]]]:
    """The ranked table of the best draft vocabulary at a context length, and every vocabulary's."""
    choices = [choose_budget(costs, model, v, context=context)[3] for v in model.vocabs]
    return max(choices, key=lambda t: t[0]["tokens_per_s"]), choices


def choice_at_context(report: dict, context: int) -> dict:
    """The best budget row at a context length, from a report's cached costs and replayed grid."""
    table, _ = _best_table(Costs.from_json(report["costs"]), AcceptModel.from_json(report["accept_table"]), context)
    return table[0]


def auto_config(target: Target, head: AnyHead, base_cfg: DecodeConfig, prompts: list[str] | None = None,
                vocabs: tuple[int, ...] = VOCABS, repeats: int = 5, max_new_tokens: int = 64,
                ns: tuple[int, ...] = NS, top_ks: tuple[int, ...] = TOP_KS,
                refresh: bool = False) -> tuple[DecodeConfig, dict]:
    """The budget with the most expected tokens/s on this machine: (config, report). The first call
    measures costs (~20 s on a CPU) and calibrates on a few prompts (~30-60 s); the result is cached
    per machine key + head weights + settings, so later calls (the app, every bench) are instant."""
    settings = json.dumps([AUTO_REPORT_VERSION, prompts, vocabs, max_new_tokens, ns, top_ks])
    fingerprint = hashlib.sha1(f"{cost_key(target, head)}|{head_fingerprint(head)}|{settings}".encode()).hexdigest()[:16]
    path = cache_dir() / "costs" / f"auto-{fingerprint}.json"
    report = None if refresh else read_auto_report(path, ns, top_ks, vocabs)
    if report is not None and measured_under_load(report["t_verify"]["1"], probe_t1(target, head)):
        report, refresh = None, True  # its costs were timed under load: measure and choose again
    if report is None:
        report = _auto_report(target, head, prompts, vocabs, repeats, max_new_tokens, ns, top_ks, refresh)
        atomic_write_json(path, report, indent=1)
    fastest = fastest_vanilla(target, report["t_plain"])
    report = {**report, "auto_file": str(path), **against_fastest(report, fastest)}
    return base_cfg.with_(**report["chosen"]), report


REPORT_KINDS = {"curve": "list", "vanilla_tokens_per_s": "nonneg", "t_plain": "nonneg", "t_verify": "dict",
                "alpha": "num", "chosen": "dict", "expected_tokens_per_s": "nonneg", "expected_speedup": "nonneg",
                "expected_accept_length": "nonneg", "costs": "dict", "accept_table": "dict", "top": "list",
                "by_context": "list", "best_per_vocab": "list"}
ACCEPT_KINDS = {"ns": "ints", "depths": "ints", "top_ks": "ints", "vocabs": "ints", "grid": "dict"}


def read_auto_report(path: Path, ns: tuple[int, ...], top_ks: tuple[int, ...],
                     vocabs: tuple[int, ...]) -> dict | None:
    """A cached auto-budget report, or None (chosen again) when missing or malformed: its costs a cost
    cache, its choice within the searched grid and on its curve, its accept table a grid per top_k/vocab."""
    report = read_json_or_none(path)
    if report is None:
        return None
    try:
        check_object(report, path, "report", REPORT_KINDS)
        t_verify = report["t_verify"]
        _check_seconds(t_verify, path, "field 't_verify'")
        if "1" not in t_verify or t_verify["1"] <= 0 or report["t_plain"] <= 0:
            fail(path, "field 't_verify' or 't_plain'", "lacks the one-token time")
        check_costs(report["costs"], path, "field 'costs'")
        _check_choice(report, path, ns, top_ks, vocabs)
        check_object(report["accept_table"], path, "field 'accept_table'", ACCEPT_KINDS)
        for shape, grid in report["accept_table"]["grid"].items():
            if not re.fullmatch(r"[0-9]+/[0-9]+", shape) or not isinstance(grid, list):
                fail(path, f"field 'accept_table' grid {shape!r:.40}", "is not a grid of a top_k/vocab")
    except FileFormatError:
        return None
    return report


def _check_choice(report: dict, path: Path, ns: tuple[int, ...], top_ks: tuple[int, ...],
                  vocabs: tuple[int, ...]) -> None:
    chosen = check_object(report["chosen"], path, "field 'chosen'", {k: "nat" for k in BUDGET_KEYS})
    check_in(chosen["total_tokens"], ns, path, "field 'chosen' total_tokens")
    check_in(chosen["top_k"], top_ks, path, "field 'chosen' top_k")
    check_in(chosen["draft_vocab"], vocabs, path, "field 'chosen' draft_vocab")
    if chosen["depth"] > max(DEPTHS):  # depth 0 (the root's children only) is in the searched grid
        fail(path, "field 'chosen' depth", f"is beyond the searched {max(DEPTHS)}")
    for i, row in enumerate(report["curve"]):
        check_object(row, path, f"field 'curve' [{i}]", {"total_tokens": "nat"})
    if not any(row["total_tokens"] == chosen["total_tokens"] for row in report["curve"]):
        fail(path, "field 'curve'", "lacks the chosen total_tokens")


def fastest_vanilla(target: Target, t1: float) -> dict:
    """The fastest plain decoding of this model here: {"dtype", "tokens_per_s"}. On a CPU the precision
    probe's one-token forward per dtype (measured once, cached) scales `t1`, the target's own measured
    one-token forward (a precision the probe does not run, fp16 on a CPU, is compared by the probe's
    absolute times); on CUDA the target's dtype (bf16/fp16) is taken as the fastest."""
    own = dtype_name(target.dtype)
    ms = choose_cpu_dtype(target)["ms"] if target.device.type == "cpu" else {}
    if ms and own not in ms:  # e.g. fp16 on a CPU: no ratio to it, so the probe's own times compete
        best = min(ms, key=lambda d: ms[d]["1"])
        if ms[best]["1"] / 1000 < t1:
            return {"dtype": best, "tokens_per_s": tokens_per_second(1, ms[best]["1"] / 1000)}
        return {"dtype": own, "tokens_per_s": tokens_per_second(1, t1)}
    best = min(ms, key=lambda d: ms[d]["1"]) if own in ms else own
    scale = ms[best]["1"] / ms[own]["1"] if own in ms else 1.0
    return {"dtype": best, "tokens_per_s": tokens_per_second(1, t1 * scale)}


def vanilla_name(report: dict) -> str:
    """What a report's expected_speedup is against, for a sentence: "vanilla bfloat16, the fastest here"."""
    return f"vanilla {report['vanilla_dtype']}, the fastest here" if "vanilla_dtype" in report else "vanilla"


def against_fastest(report: dict, fastest: dict) -> dict:
    """The report's speed-ups restated against the fastest vanilla (the same-dtype ones kept beside):
    expected_speedup and beats_vanilla are what the product shows."""
    factor = report["vanilla_tokens_per_s"] / fastest["tokens_per_s"]
    return {"vanilla_same_dtype_tokens_per_s": report["vanilla_tokens_per_s"],
            "vanilla_tokens_per_s": fastest["tokens_per_s"], "vanilla_dtype": fastest["dtype"],
            "expected_speedup_same_dtype": report["expected_speedup"],
            "expected_speedup": report["expected_speedup"] * factor,
            "beats_vanilla": report["expected_speedup"] * factor > 1.0, "same_dtype_factor": factor,
            "by_context": [{**r, "speedup": r["speedup"] * factor} for r in report.get("by_context", [])]}


def adaptive_costs(report: dict) -> RoundCosts:
    """The per-round size model for the auto report's draft shape: verify costs by size (and by
    context length when measured at several), the shape's drafting cost, and the value calibration."""
    curve = report["curve"]
    measured = {int(n): t for n, t in report["t_verify"].items()}
    best = next(r for r in curve if r["total_tokens"] == report["chosen"]["total_tokens"])
    fixed = max(0.0, best["round_s"] - measured[best["total_tokens"]])
    by_context = Costs.from_json(report["costs"]).verify_by_context if "costs" in report else None
    return RoundCosts.interpolate(measured, fixed, report["alpha"], max(r["total_tokens"] for r in curve),
                                  by_context)


def tuned_config(target: Target, head: AnyHead, base_cfg: DecodeConfig, budget: str,
                 context: int | None = None) -> tuple[DecodeConfig, RoundCosts | None, dict]:
    """base_cfg with the auto budget (budget "auto"), or with auto's draft shape and an adaptive tree
    size ("adaptive": total_tokens becomes the cap, the largest size the shape can fill, and the
    returned round costs let each round pick its own size up to it, at that round's context length).
    `context`: the typical context length of the generation ahead (auto then chooses for it, from the
    costs measured at several lengths). Also returns the auto report."""
    cfg, report = auto_config(target, head, base_cfg)
    if budget == "auto":
        if context is not None and "costs" in report:
            row = choice_at_context(report, context)
            choice = {**{k: row[k] for k in BUDGET_KEYS}, "speedup": row["speedup"] * report["same_dtype_factor"],
                      "speedup_same_dtype": row["speedup"]}
            report = {**report, "context": context, "context_choice": choice}
            cfg = cfg.with_(**{k: row[k] for k in BUDGET_KEYS})
        return cfg, None, report
    costs = adaptive_costs(report)
    return cfg.with_(total_tokens=len(costs.verify)), costs, report
