"""What a round costs on this machine: verify t(n) over several context lengths, drafting per
(top_k, vocabulary) linear in depth, the per-round overhead and the prefill, measured with the decoder's
own functions in interleaved probes and cached per machine key; and the host terms, what a real
decode spends beyond the probes. Also the grid every budget search covers."""
from __future__ import annotations

import copy
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ...core.adaptive import interpolate
from ...core.config import PRESETS, DecodeConfig, TreeShape
from ...core.decode import Decoder, Drafter, draft_round, generate, greedy_accept, new_drafter
from ...core.tree import build_tree
from ...core.nodes import TokenTexts
from ...models.head import AnyHead, head_dtype, head_shape
from ...models.kernels import kernel_tag, module_kernel, set_head_precision
from ...models.location import cache_dir
from ...models.precision import device_name, dtype_name
from ...models.target import Target
from ...records.files import atomic_write_json, read_json_or_none
from ...records.trace import StepRecord
from ...records.schema import FileFormatError, check_object, check_value, fail, is_kind
from ...records.timing import measured_under_load, time_interleaved

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
# tokens decoded per prompt (after a short warm-up) to measure the host terms: at 32 (a round of each in
# turn), three calibrations in a row put a round at 1.24-1.34x a plain token; at 64, token for token, at
# 1.30-1.32x (2026-12-07, AMD EPYC, bf16)
HOST_TOKENS = 64
# host_terms decodes the tree and plain side by side in stretches of this many tokens, not a round each:
# a plain round right after a tree round runs ~2 % slower than after a plain one (the head's forwards push
# the target's KV cache out of the caches), and a bench's vanilla runs whole prompts; round by round, the
# plain scale came out high and the tree/plain verify ratio 0.96-1.02 where benches measured 1.12-1.18
# (2026-12-07, AMD EPYC Zen 5, bf16)
HOST_STRETCH = 16
HOST_PROMPTS = 4  # calibration prompts decoded for them: one prompt's ~13 rounds put the tree term 1.9 ms
# below what a bench's 827 rounds then spent there (2026-12-06, AMD EPYC)
# Probe passes: at 5, t(n) of the verify came out non-monotone by up to 3 ms between neighbouring sizes
# (t(3) 49.1, t(4) 46.4, t(5) 45.6 ms, 2026-12-07, AMD EPYC, bf16), where real decodes side by side put
# a 5-node verify 4-5 % above a 4-node one; at 15 passes the same probe rose 0.8-6 ms a size.
REPEATS = 11
COSTS_VERSION = 8  # bump when a round's drafting or host work changes what the probes time: cached costs are remeasured
DRAFT_PHASES = ("consume", "commit")  # with the draft.i steps: what t_draft + overhead model


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
    # A real decode's verify + acceptance over the probe's (host_terms): the probes report medians of
    # a few interleaved repeats, a decode's throughput is the mean of rounds between draft forwards
    # (on the 2-core EPYC, 2026-12-06: 54.6 ms a real 8-node verify against the probe's 49.3).
    verify_scale_tree: float = 1.0
    verify_scale_plain: float = 1.0
    # A real round's drafting (draft steps, consume, commit) over the probes' (host_terms): the probes time
    # the head warm, repeated; in a round it runs right after the target's verify has pushed its weights out
    # of the caches (2026-12-07, AMD EPYC Zen 5, bf16: a draft step of 4 x 16,384 took 2.1-2.3 ms a round
    # against the probe's 1.44). A constant host term priced that excess the same for every depth and draft
    # vocabulary, so deeper and wider drafts looked cheaper than they run.
    draft_scale: float = 1.0

    def t_verify(self, n: float, context: int | None = None) -> float:
        """Piecewise-linear in n (and in the context length, when measured at several)."""
        if context is None or len(self.verify_by_context) < 2:
            return interpolate(self.verify, n)
        return interpolate({c: interpolate(t, n) for c, t in self.verify_by_context.items()}, context)

    def t_draft(self, depth: int, top_k: int, vocab: int = 0) -> float:
        base, step = self.draft[f"{top_k}/{vocab}"]
        return base + depth * step

    def round_cost(self, n: int, depth: int, top_k: int, vocab: int = 0, context: int | None = None,
                   lookup_nodes: float = 0.0, lookup_share: float = 1.0) -> float:
        """Seconds per round; a 1-node tree is plain decoding (no draft). `lookup_nodes`: the mean size of
        a prompt-lookup branch verified beside the n-node tree, per round; `lookup_share`: the share of
        rounds that verify one (a branch of lookup_nodes / share nodes, the rest none). The verify is
        priced per kind of round, not at the mean size: t(n) is not linear (2026-12-07, AMD EPYC, 4-node
        tree with 0.77 lookup nodes a round in 30 % of the rounds: t at the mean size 46.0 ms, the mean
        of t over the rounds 48.2, the two-kind price 48.4)."""
        if n == 1:
            return self.t_plain(context)
        verify = self.t_verify(n, context)
        if lookup_nodes > 0:
            share = min(1.0, lookup_share) if lookup_share > 0 else 1.0
            verify = (1 - share) * verify + share * self.t_verify(n + lookup_nodes / share, context)
        verify *= self.verify_scale_tree
        drafting = self.draft_scale * (self.t_draft(depth, top_k, vocab) + self.overhead)
        round_s = verify + drafting + self.host_tree
        return max(round_s, 0.5 * verify)  # a negative host term: a sanity floor

    def t_plain(self, context: int | None = None) -> float:
        """Seconds per token of plain decoding."""
        verify = self.verify_scale_plain * self.t_verify(1, context)
        return max(verify + self.host_plain, 0.5 * verify)

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
                   float(d.get("host_tree", 0.0)), float(d.get("host_plain", 0.0)),
                   float(d.get("verify_scale_tree", 1.0)), float(d.get("verify_scale_plain", 1.0)),
                   float(d.get("draft_scale", 1.0)))

    def covers(self, ns: tuple[int, ...], top_ks: tuple[int, ...], vocabs: tuple[int, ...],
               contexts: tuple[int, ...] = ()) -> bool:
        return set(ns) <= set(self.verify) and all(f"{k}/{v}" in self.draft for k in top_ks for v in vocabs) \
            and set(contexts) <= set(self.verify_by_context)


def cost_key(target: Target, head: AnyHead) -> str:
    """Costs are the machine's, the target's and its precision, and the head's shape (head_shape) and
    precision (the head may draft in one of its own)."""
    own = head_dtype(head)
    drafts = "" if own == target.dtype else f"|head={dtype_name(own)}"
    kernel = kernel_tag(target)
    kernel += "" if module_kernel(head) == "default" else f"|head-{module_kernel(head)}"
    return f"{target.name}|threads={torch.get_num_threads()}|{device_name(target.device)}|{target.dtype}|" \
           f"{head_shape(head)}{drafts}{kernel}"


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
                  "host_plain": "num", "verify_scale_tree": "positive", "verify_scale_plain": "positive",
                  "draft_scale": "positive"}


def check_costs(d: dict, path: str | Path, what: str = "costs") -> dict:
    """A cost cache: seconds >= 0 by token count (verify, prefill, verify over each context), and
    (base, per expansion) seconds by "top_k/vocab" (draft)."""
    check_object(d, path, what, COSTS_KINDS, COSTS_OPTIONAL)
    check_seconds(d["verify"], path, f"{what} field 'verify'")
    check_seconds(d.get("prefill", {}), path, f"{what} field 'prefill'", empty=True)
    for context, by_n in d.get("verify_by_context", {}).items():
        _check_count(context, path, f"{what} field 'verify_by_context'")
        check_value(by_n, path, f"{what} field 'verify_by_context' {context!r}", "dict")
        check_seconds(by_n, path, f"{what} field 'verify_by_context' {context!r}")
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


def check_seconds(by_n: dict, path: str | Path, field: str, empty: bool = False) -> None:
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
        """A round's verify forward of an n-node tree (a chain) and its greedy acceptance, as the decoder
        runs them (greedy_accept: what acceptance costs per node must match the decoder's, or the cost
        model misprices large trees)."""
        dev = self.ids.device
        tree = build_tree(self.ids[:n], torch.arange(-1, n - 1, device=dev), n)
        positions = (self.prefix_len + tree.depths)[None]

        def run() -> None:
            logits, _ = self.target.forward(tree.tokens[None], positions, self.cache, self.prefix_len,
                                            tree.mask if n > 1 else None)
            greedy_accept(tree, logits[0])
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

        def run() -> None:  # a typical round commits ~3 tokens, off the tree's first branch (so they move)
            drafter.cache.length = start
            drafter.consume(self.ids[:3], self.features[0, :3])
            self.cache.commit([self.prefix_len, self.prefix_len + 2, self.prefix_len + 4])
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
    verify = monotone({n: t[f"v{n}"] for n in ns})
    by_context = {c: monotone({n: t[f"v{n}@{c}"] for n in ns}) for c in longer}
    by_context = {prefix_len: verify, **by_context} if longer else {}
    meta = {"prefix_len": prefix_len, "repeats": repeats, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    return Costs(cost_key(target, head), verify, draft, t["overhead"], meta, by_context,
                 {p: t[f"p{p}"] for p in prefill_lens})


def monotone(by_n: dict[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of seconds by token count (pool adjacent violators): a verify
    of more tokens never costs less, so a probe's dip below its smaller neighbour is noise, and left in it
    would make the larger tree look free."""
    blocks: list[list[float]] = []  # [mean, count] of pooled neighbours, in order of n
    for n in sorted(by_n):
        blocks.append([by_n[n], 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    fitted = [m for m, c in blocks for _ in range(int(c))]
    return dict(zip(sorted(by_n), fitted))


def time_head_dtypes(target: Target, head: AnyHead, precisions: tuple[str, ...], repeats: int = 9) -> dict:
    """A round's drafting by a copy of the head in each precision (kernels.set_head_precision): the head
    catching up on 3 accepted tokens, then a draft of the cpu preset's shape (top_k 4 over the 4,096 most
    frequent tokens, one expansion: the shapes auto picks on a CPU), each right after a one-token target
    forward as in a round, whose weights push the head's out of the caches (timed warm, an int8 head's
    half-size reads do not show): {precision: {"draft": ms}}, the forward's own time taken off, from jobs
    run interleaved. The head is left as it is."""
    shared = target.model.model.embed_tokens  # the copies share it too: casting leaves it alone
    verify = _Probe(target, head, PREFIX_LEN, 1).verify(1)
    shape = PRESETS["cpu"]
    jobs = {"verify": verify}
    for p in precisions:
        twin = _Probe(target, set_head_precision(target, copy.deepcopy(head, {id(shared): shared}), p), PREFIX_LEN, 1)
        consume, draft = twin.overhead(), twin.draft(shape.top_k, shape.draft_vocab, shape.depth)
        jobs[p] = lambda consume=consume, draft=draft: (verify(), consume(), draft())
    with torch.inference_mode():
        t = time_interleaved(jobs, repeats, f"timing the head in {' vs '.join(precisions)} once for --head-dtype auto")
    return {p: {"draft": round(max(0.01, 1000 * (t[p] - t["verify"])), 2)} for p in precisions}


def probe_t1(target: Target, head: AnyHead, prefix_len: int = PREFIX_LEN, repeats: int = 5) -> float:
    """A quick (~1 s) timing of a one-token verify, to check a cached measurement against."""
    probe = _Probe(target, head, prefix_len, 1)
    with torch.inference_mode():
        return time_interleaved({"v1": probe.verify(1)}, repeats, "check costs")["v1"]


def measure_costs(target: Target, head: AnyHead, ns: tuple[int, ...] = NS, top_ks: tuple[int, ...] = TOP_KS,
                  vocabs: tuple[int, ...] = VOCABS, repeats: int = REPEATS, prefix_len: int = PREFIX_LEN,
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


def host_terms(target: Target, head: AnyHead, costs: Costs, chosen: dict, prompts: list[list[int]],
               lookup_tokens: int = 0, max_new_tokens: int = HOST_TOKENS) -> Costs:
    """costs with what real decoding of the prompts (token ids) shows beyond the probes: the verify
    scale (a real round's verify + acceptance over the probe's) and the host term (the mean seconds per
    round spent beyond the modelled draft and overhead: acceptance's bookkeeping, the lookup branch's
    matching, records), each for the chosen tree (with its prompt-lookup branch) and for plain decoding.
    The two decode each prompt side by side, in stretches of HOST_STRETCH tokens: what the model
    predicts is their ratio, and a shared VM's speed drifts by 10-20 % within minutes (2026-12-07, AMD
    EPYC: decoded one after the other, the plain scale came out 1.21 and the tree's 1.07, where a bench
    then measured 0.93 and 0.98; prompt by prompt, their ratio still moved 1.14-1.29 between three
    calibrations)."""
    base = replace(costs, host_tree=0.0, host_plain=0.0, verify_scale_tree=1.0, verify_scale_plain=1.0)
    tree = DecodeConfig(mode="dynamic", max_new_tokens=max_new_tokens,
                        lookup_tokens=lookup_tokens).with_shape(TreeShape.of(chosen))
    configs = {"tree": tree, "plain": tree.with_(mode="vanilla", lookup_tokens=0)}
    terms = {name: _DecodeTerms(base, cfg) for name, cfg in configs.items()}
    for cfg in configs.values():  # warm-up: the first decode of a config pays one-off allocations
        generate(Decoder(target, head, cfg.with_(max_new_tokens=min(8, cfg.max_new_tokens))), prompts[0])
    for ids in prompts:
        runs = {name: Decoder(target, head, cfg).steps(ids) for name, cfg in configs.items()}
        produced = dict.fromkeys(runs, 0)
        name = "tree"
        while runs:  # side by side, in stretches of HOST_STRETCH tokens (the phases are timed inside each round)
            if name not in runs or produced[name] - min(produced[n] for n in runs) >= HOST_STRETCH:
                name = min(runs, key=produced.__getitem__)
            step = next(runs[name], None)
            if step is None:
                del runs[name]
                continue
            terms[name].add(step, len(ids))
            produced[name] += len(step.new_tokens)
    (scale_tree, host_tree, draft_scale), (scale_plain, host_plain, _) = (terms[k].result() for k in ("tree", "plain"))
    return replace(base, host_tree=host_tree, host_plain=host_plain, verify_scale_tree=scale_tree,
                   verify_scale_plain=scale_plain, draft_scale=draft_scale)


class _DecodeTerms:
    """(verify scale, host seconds per round, draft scale) of real decodes with one config, every round
    modelled at its own tree size and context length. The scales are ratios of sums over all rounds (a mean,
    as throughput is), so one slow round moves them little: the verify's (with acceptance) over the probe's
    t(n), the drafting's (draft steps, consume, commit) over the probes' draft and overhead. The host term
    is what the rounds spend outside their verify, acceptance and drafting."""

    def __init__(self, costs: Costs, cfg: DecodeConfig) -> None:
        self.costs, self.cfg = costs, cfg
        self.real, self.modelled, self.extra = 0.0, 0.0, []
        self.draft_real, self.draft_modelled = 0.0, 0.0
        self.context = 0

    def add(self, s: StepRecord, prompt_tokens: int) -> None:
        """A step of a generation from a prompt of `prompt_tokens` (step 0, its prefill, starts one)."""
        cfg, costs = self.cfg, self.costs
        if s.step == 0:
            self.context = prompt_tokens
        else:
            n = max(1, sum(node.kept for node in s.nodes))  # the verified tree, root included
            verify = s.timings.get("verify", 0.0) + s.timings.get("accept", 0.0)
            probe = costs.t_verify(n, self.context)
            self.real, self.modelled = self.real + verify, self.modelled + probe
            drafting = 0.0
            if n > 1:  # a drafted round (a 1-node one is plain decoding: its commit is host work)
                drafting = sum(t for phase, t in s.timings.items()
                               if phase in DRAFT_PHASES or phase.startswith("draft."))
                self.draft_real += drafting
                self.draft_modelled += costs.t_draft(cfg.depth, cfg.top_k, cfg.draft_vocab) + costs.overhead
            self.extra.append(sum(s.timings.values()) - verify - drafting)
        self.context += len(s.new_tokens)

    def result(self) -> tuple[float, float, float]:
        scale = self.real / self.modelled if self.real > 0 and self.modelled > 0 else 1.0
        draft = self.draft_real / self.draft_modelled if self.draft_real > 0 and self.draft_modelled > 0 else 1.0
        return scale, float(np.mean(self.extra)) if self.extra else 0.0, draft
