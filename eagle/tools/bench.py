"""`python -m eagle bench`: every mode on a question set, interleaved prompt by prompt in one run.

Modes: vanilla, static, dynamic (this repo's decoder) and hf, hf_pld (Hugging Face `generate`, plain
and with prompt lookup). A decoder mode may carry its own budget, `dynamic:TOTAL/DEPTH/TOP_K[/VOCAB]`,
so a sweep of budgets runs under the same machine load as its baselines.

--out holds: traces/<mode>.jsonl (every trace; an hf trace is a header and one summary step),
steps.parquet (one row per step) and summary.json. Each finished generation is appended (one
locked write, fsynced) to its mode's trace file; a rerun with the same --out skips every (question,
turn, mode) already there, so an interrupted bench loses no finished work. A stored generation is
reused only if it was made with the same settings, model, head weights and question text (else the
run is refused, naming what differs); one lock per --out keeps a second run from doing it all twice.
"""
from __future__ import annotations

import argparse
import io
import copy
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from .budget import Costs, expected_seconds, tuned_config, vanilla_name
from .session import Session
from .specbench import RUN_FIELDS, RunSettings, check_same_run, export_spec_bench, format_speedups, speedups
from ..records.stats import mean, speedup, tau, tokens_per_second
from .checks import ArgumentParser, check_argv, check_output, check_runtime_args
from .loading import KNOBS_EPILOG, DecodeSettings, ModelSpec, add_decode_args, budget_mode, check_local_paths, \
    config_from_args, flag_name, load_pair, model_spec
from ..core.config import MODES, DecodeConfig
from ..core.decode import Decoder, encode_prompt, generate
from ..core.detok import TextWindow, next_text, token_text
from ..records.files import atomic_write, cut_torn_tail, exclusive_lock, read_json_object, run_guarded
from ..models.head import head_sha256
from ..records.schema import FileFormatError, check_object, check_value
from ..records.questions import DATASETS, Question, load_questions, select_questions
from ..records.timing import STEP_PHASES, phase_seconds
from ..records.markdown import markdown_table
from ..core.lossless import first_divergence, is_precision_flip, logit_gap_at
from ..models.target import DTYPES, Target, dtype_name, runnable_dtypes
from ..records.trace import StepRecord, Trace, TraceHeader, append_trace, read_trace

HF_MODES = ("hf", "hf_pld")
BASELINE_KINDS = ("vanilla", "hf", "hf_pld")  # what a speed-up is measured against
KINDS = (*MODES, *HF_MODES)
PLD_TOKENS = 10  # prompt_lookup_num_tokens for hf_pld (the transformers docs' usual value)
WARMUP_TOKENS = 8
BUDGET_FIELDS = ("total_tokens", "depth", "top_k", "draft_vocab")




# ---- modes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModeSpec:
    label: str  # as given on the command line, e.g. "dynamic:16/4/4/8192" or "hf@float32"
    kind: str  # one of KINDS
    overrides: tuple[tuple[str, int], ...] = ()
    budget: str = "fixed"  # "auto" / "adaptive" for dynamic:auto and dynamic:adaptive
    dtype: str | None = None  # "@float32" etc.; None: the run's --dtype

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_]+", "-", self.label).strip("-")


def parse_modes(text: str) -> list[ModeSpec]:
    """MODE[:BUDGET][@DTYPE], comma-separated; e.g. vanilla, dynamic:auto, hf@float32."""
    specs = []
    for label in (m.strip() for m in text.split(",") if m.strip()):
        body, at, dtype = label.partition("@")
        if at and dtype not in DTYPES:
            raise ValueError(f"mode {label!r}: unknown dtype {dtype!r}, choose from {', '.join(DTYPES)}")
        kind, _, budget = body.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown mode {kind!r}: choose from {', '.join(KINDS)}")
        overrides: tuple[tuple[str, int], ...] = ()
        if kind == "dynamic" and budget in ("auto", "adaptive"):
            specs.append(ModeSpec(label, kind, (), budget, dtype or None))
            continue
        if budget:
            parts = budget.split("/")
            if kind not in ("static", "dynamic") or not 3 <= len(parts) <= 4 or not all(p.isdigit() for p in parts):
                raise ValueError(f"mode {label!r}: a budget is static|dynamic:TOTAL/DEPTH/TOP_K[/DRAFT_VOCAB], "
                                 "dynamic:auto or dynamic:adaptive")
            overrides = tuple(zip(BUDGET_FIELDS, map(int, parts)))
        specs.append(ModeSpec(label, kind, overrides, dtype=dtype or None))
    if not specs or len({s.label for s in specs}) != len(specs):
        raise ValueError("--modes needs at least one mode and no repeats")
    return specs


def with_baselines(specs: list[ModeSpec], run_dtype: str, dtypes: tuple[str, ...]) -> list[ModeSpec]:
    """The modes plus each baseline mode given without a dtype (vanilla, hf, hf_pld) at every other
    precision in `dtypes`, so every speed-up can be against the fastest of its kind on this machine."""
    have = {(s.kind, s.dtype or run_dtype) for s in specs}
    extra = [ModeSpec(f"{s.kind}@{d}", s.kind, dtype=d) for s in specs if s.kind in BASELINE_KINDS and s.dtype is None
             for d in dtypes if (s.kind, d) not in have]
    return specs + list(dict.fromkeys(extra))


def hf_config(base: DecodeConfig, kind: str) -> dict:
    """What an hf mode's output depends on (stored in its trace header, checked on resume)."""
    return {"mode": kind, "max_new_tokens": base.max_new_tokens, "temperature": base.temperature,
            "top_p": base.top_p, "top_k_sampling": base.top_k_sampling, "seed": base.seed,
            "prompt_lookup_num_tokens": PLD_TOKENS if kind == "hf_pld" else None}


# ---- running one generation -------------------------------------------------------------------
@dataclass
class Result:
    question_id: int | str
    category: str
    turn: int
    mode: str
    tokens: list[int]
    seconds: float
    forwards: int
    steps: list[StepRecord] = field(repr=False)
    messages: list[dict] = field(default_factory=list, repr=False)  # the chat the prompt was built from
    prompt_tokens: int = 0  # the encoded prompt's length (what the cost model's prefill depends on)


class HFRunner:
    """Hugging Face `generate` on the same weights, counting the target's forward passes."""

    def __init__(self, target: Target, cfg: DecodeConfig, kind: str) -> None:
        from transformers import GenerationConfig
        eos = sorted(target.eos_ids)
        sample = dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k_sampling) \
            if not cfg.greedy else dict(do_sample=False)
        pld = dict(prompt_lookup_num_tokens=PLD_TOKENS) if kind == "hf_pld" else {}
        self.gen_config = GenerationConfig(max_new_tokens=cfg.max_new_tokens, eos_token_id=eos,
                                           pad_token_id=eos[0], **sample, **pld)
        self.target, self.cfg, self.eos = target, cfg, set(eos)

    def __call__(self, ids: list[int], max_new_tokens: int | None = None) -> tuple[list[int], int, str]:
        calls = [0]
        hook = self.target.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        torch.manual_seed(self.cfg.seed)
        x = torch.tensor([ids], device=self.target.device)
        gen_config = self.gen_config
        if max_new_tokens is not None:  # the warm-up: a shorter copy (generate warns on mixed kwargs)
            gen_config = copy.deepcopy(gen_config)
            gen_config.max_new_tokens = max_new_tokens
        try:
            with torch.inference_mode():
                out = self.target.model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen_config)
        finally:
            hook.remove()
        tokens = out[0, len(ids):].tolist()
        return tokens, calls[0], "eos" if tokens and tokens[-1] in self.eos else "max_new_tokens"


@dataclass
class Pair:
    """The target and draft head at one precision."""
    target: Target
    head: object | None
    source: str | None  # where the head came from (None without one)
    head_sha: str | None = None  # eagle.models.head.head_sha256 of its weights (checked on resume)


class Bench:
    """The models (one pair per dtype), one runner per mode, and the trace header each generation gets."""

    def __init__(self, pairs: dict[str, Pair], default_dtype: str, configs: dict[str, DecodeConfig],
                 specs: list[ModeSpec], costs: dict | None = None, predicted: dict[str, dict] | None = None) -> None:
        self.pairs, self.default_dtype, self.specs = pairs, default_dtype, specs
        self.configs, self.costs = configs, costs or {}  # costs: label -> RoundCosts (adaptive modes)
        self.predicted = predicted or {}  # label -> the auto report its budget came from (tuned modes)
        self._sessions: dict[str, Session] = {}
        self.hf = {s.label: HFRunner(self.pair(s).target, configs[s.label], s.kind) for s in specs
                   if s.kind in HF_MODES}

    @property
    def target(self) -> Target:
        """The run's default target (its tokenizer builds every prompt: all pairs share it)."""
        return self.pairs[self.default_dtype].target

    @property
    def head_source(self) -> str | None:
        return self.pairs[self.default_dtype].source

    def head_sha(self, spec: ModeSpec) -> str | None:
        """The weights hash of the head a mode drafts with (None for modes without a head)."""
        return self.pair(spec).head_sha if spec.kind in ("static", "dynamic") else None

    def dtype(self, spec: ModeSpec) -> str:
        return spec.dtype or self.default_dtype

    def pair(self, spec: ModeSpec) -> Pair:
        return self.pairs[self.dtype(spec)]

    def config_dict(self, spec: ModeSpec) -> dict:
        cfg = self.configs[spec.label]
        if spec.kind in HF_MODES:
            return {**hf_config(cfg, spec.kind), "dtype": self.dtype(spec)}
        costs = self.costs.get(spec.label)
        # lists, not tuples: the dict must equal its JSON round trip for resume to recognise it
        extra = {"adaptive_costs": costs.to_json()} if costs else {}
        return {**asdict(cfg), **extra, "dtype": self.dtype(spec)}

    def run(self, spec: ModeSpec, ids: list[int],
            max_new_tokens: int | None = None) -> tuple[list[int], float, int, list[StepRecord]]:
        """One generation -> tokens, wall seconds, target forwards, step records."""
        pair = self.pair(spec)
        if spec.kind in HF_MODES:
            t0 = time.perf_counter()
            tokens, forwards, finished = self.hf[spec.label](ids, max_new_tokens)
            seconds = time.perf_counter() - t0
            tok = self.target.tokenizer
            text = next_text(tok, TextWindow(), tokens, final=True)[0]  # one round: the text as the Decoder's records
            step = StepRecord(step=0, mode=spec.kind, nodes=[], accepted=[], bonus_token=tokens[-1],
                              bonus_text=token_text(tok, tokens[-1]), new_tokens=tokens,
                              new_text=text, accept_length=1, timings={"generate": seconds},
                              target_forwards=forwards, finished=finished)
            return tokens, seconds, forwards, [step]
        cfg = self.configs[spec.label]
        if max_new_tokens is not None:
            cfg = cfg.with_(max_new_tokens=max_new_tokens)
        decoder = Decoder(pair.target, pair.head if spec.kind != "vanilla" else None, cfg, self.costs.get(spec.label))
        t0 = time.perf_counter()
        g = generate(decoder, ids)
        return g.tokens, time.perf_counter() - t0, g.target_forwards, g.steps

    def header(self, spec: ModeSpec, q: Question, turn: int, messages: list[dict], n_ids: int,
               seconds: float, n_tokens: int, dataset: str | None = None) -> TraceHeader:
        meta = {"question_id": q.question_id, "category": q.category, "turn": turn, "mode_label": spec.label,
                **({"dataset": dataset} if dataset else {}),
                "seconds": seconds, "new_tokens": n_tokens, "threads": torch.get_num_threads(),
                "head_sha": self.head_sha(spec)}  # what resume checks (older stores have no head_version)
        return self.session(spec).header(messages, self.config_dict(spec), n_ids, **meta)

    def session(self, spec: ModeSpec) -> Session:
        dtype = self.dtype(spec)
        if dtype not in self._sessions:  # the head's identity is hashed once per pair
            pair = self.pairs[dtype]
            self._sessions[dtype] = Session.of(pair.target, pair.head, pair.source)
        return self._sessions[dtype]


# ---- the trace store (resume) -----------------------------------------------------------------
Key = tuple[object, int, str]  # (question_id, turn, mode label)


RESULT_META = ("question_id", "category", "turn", "mode_label", "seconds")
# The kinds (eagle.records.schema) of what a stored generation's header meta holds for resume and the summary.
RESULT_KINDS = {"category": "str", "turn": "nat", "mode_label": "str", "seconds": "nonneg"}
RESULT_OPTIONAL = {"messages": "list", "head_sha": "str?", "new_tokens": "nat"}


def check_result_meta(trace: Trace, path: Path) -> None:
    """A stored generation's meta, checked before resume reuses it (a malformed one is generated again)."""
    meta = trace.header.meta
    what = f"the header of generation {trace.header.generation or '?'} meta"
    check_object(meta, path, what, RESULT_KINDS, RESULT_OPTIONAL)
    qid = meta["question_id"]
    if not (type(qid) is int or (isinstance(qid, str) and qid)):
        check_value(qid, path, f"{what} field 'question_id'", "int")
    if meta["turn"] < 1:
        check_value(None, path, f"{what} field 'turn'", "nat")  # a turn counts from 1
    for i, m in enumerate(meta.get("messages") or []):
        check_object(m, path, f"{what} messages[{i}]", {"role": "str", "content": "str"})


def _result_of(trace: Trace) -> Result:
    m = trace.header.meta
    tokens = [t for s in trace.steps for t in s.new_tokens]
    messages = m.get("messages") or [{"role": "user", "content": trace.header.prompt}]
    return Result(m["question_id"], m["category"], int(m["turn"]), m["mode_label"], tokens,
                  float(m["seconds"]), sum(s.target_forwards for s in trace.steps), trace.steps, messages,
                  int(trace.header.prompt_tokens or 0))


@dataclass(frozen=True)
class Expected:
    """What a stored generation must have been made with for this run to reuse it."""
    label: str
    config: dict
    model: str
    head_sha: str | None
    questions: dict  # question_id -> Question of this run's dataset


def _first_difference(old: dict, new: dict) -> str | None:
    """The first setting two configs disagree on, as `name=old (this run: new)`."""
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            return f"{k}={old.get(k)!r} (this run: {new.get(k)!r})"
    return None


def _user_turns(trace: Trace) -> list[str]:
    messages = trace.header.meta.get("messages") or [{"role": "user", "content": trace.header.prompt}]
    return [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]


def _check_reusable(path: Path, trace: Trace, want: Expected) -> None:
    """Refuse, naming the difference, a stored result this run would otherwise mix with its own."""
    h = trace.header
    where = f"{path} (question {h.meta['question_id']}, turn {h.meta['turn']})"
    diff = _first_difference(h.config, want.config)
    if diff:
        raise ValueError(f"{where} was made with {diff}: rerun with the same settings or use a new --out.")
    if h.model != want.model:
        raise ValueError(f"{where} was made with model {h.model!r} (this run: {want.model!r}): use a new --out.")
    if h.meta.get("head_sha") != want.head_sha:
        was = h.meta.get("head_sha") or "not recorded"
        raise ValueError(f"{where} was made with another draft head (weights {was}, this run's {want.head_sha}): "
                         "use the same --head or a new --out.")
    q = want.questions.get(h.meta["question_id"])
    if q is not None and _user_turns(trace) != list(q.turns[:int(h.meta["turn"])]):
        raise ValueError(f"{where} answers another question text than the dataset now holds: use a new --out.")


def load_store(path: Path, want: Expected) -> dict[Key, Result]:
    """The finished generations in one mode's trace file, checked against this run (`Expected`).
    Called under the --out lock: a torn last line (a run killed mid-append) is cut; interrupted or
    foreign traces stay in the file untouched but are not reused."""
    if not path.is_file():
        return {}
    cut_torn_tail(path)
    traces, report = read_trace(path)
    for message in report.messages(path):
        print(f"note: {message}", file=sys.stderr)
    done, bad = {}, []
    for t in traces:
        if t.interrupted or not all(k in t.header.meta for k in RESULT_META):
            continue
        try:
            check_result_meta(t, path)
        except FileFormatError as err:
            bad.append(str(err))
            continue
        if t.header.meta["mode_label"] != want.label:
            continue
        _check_reusable(path, t, want)
        r = _result_of(t)
        done[(r.question_id, r.turn, r.mode)] = r
    if bad:
        print(f"note: {path}: skipped {len(bad)} stored generation(s) with a malformed header, to run again; "
              f"first: {bad[0]}", file=sys.stderr)
    return done


# ---- the run ----------------------------------------------------------------------------------
@dataclass
class Plan:
    questions: list[Question]
    turns: int
    specs: list[ModeSpec]
    out: Path
    dataset: str = ""  # mt_bench, or the dataset file's absolute path (recorded in each trace)

    @property
    def reference(self) -> ModeSpec:
        """Whose first answer the second turn builds on (and the greedy reference): vanilla if run."""
        return next((s for s in self.specs if s.kind == "vanilla"), self.specs[0])

    def trace_path(self, spec: ModeSpec) -> Path:
        return self.out / "traces" / f"{spec.slug}.jsonl"

    def keys(self) -> list[Key]:
        return [(q.question_id, t, s.label) for q in self.questions for t in range(1, min(self.turns, len(q.turns)) + 1)
                for s in self.specs]


def _messages(bench: Bench, q: Question, turn: int, done: dict[Key, Result], ref: str) -> list[dict]:
    messages = [{"role": "user", "content": q.turns[0]}]
    if turn == 2:  # the model's own first answer, as a chat would have it
        answer = bench.target.tokenizer.decode(done[(q.question_id, 1, ref)].tokens, skip_special_tokens=True)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": q.turns[1]}]
    return messages


def _run_one(bench: Bench, plan: Plan, spec: ModeSpec, q: Question, turn: int,
             done: dict[Key, Result]) -> None:
    messages = _messages(bench, q, turn, done, plan.reference.label)
    ids = encode_prompt(bench.target.tokenizer, messages, bench.target.max_context)
    tokens, seconds, forwards, steps = bench.run(spec, ids)
    header = bench.header(spec, q, turn, messages, len(ids), seconds, len(tokens), plan.dataset)
    append_trace(plan.trace_path(spec), Trace(header, steps))
    done[(q.question_id, turn, spec.label)] = Result(q.question_id, q.category, turn, spec.label, tokens,
                                                     seconds, forwards, steps, messages, len(ids))


def warm_up(bench: Bench, plan: Plan) -> None:
    """One short generation per mode, so first-call costs (allocation, kernels) stay out of the numbers."""
    ids = encode_prompt(bench.target.tokenizer, plan.questions[0].turns[0], bench.target.max_context)
    for spec in tqdm(plan.specs, desc="warm-up", unit="mode", file=sys.stderr):
        bench.run(spec, ids, max_new_tokens=WARMUP_TOKENS)


def run_plan(bench: Bench, plan: Plan, done: dict[Key, Result]) -> None:
    """Question by question, turn by turn, every mode in turn (interleaved: load drifts hit all modes)."""
    todo = {k for k in plan.keys() if k not in done}
    if not todo:
        return
    (plan.out / "traces").mkdir(parents=True, exist_ok=True)
    warm_up(bench, plan)
    units = [(q, t) for q in plan.questions for t in range(1, min(plan.turns, len(q.turns)) + 1)]
    for q, turn in tqdm(units, desc="bench", unit="turn", file=sys.stderr):
        for spec in plan.specs:
            if (q.question_id, turn, spec.label) in todo:
                _run_one(bench, plan, spec, q, turn, done)


# ---- summaries --------------------------------------------------------------------------------
def _rounds(results: list[Result]) -> list[int]:
    return [s.accept_length for r in results for s in r.steps if s.step > 0]


def mode_stats(results: list[Result], report: dict | None = None) -> dict:
    """Totals over generations, by eagle.records.stats: tokens/s is total tokens over total wall time (not a
    mean of ratios); tau = new tokens / target forwards (prefill counted as one; HF generate: 1 per
    token, PLD fewer). With the auto `report` a tuned mode's budget came from, also what its cost
    model predicted for these same generations (prompt lengths and token counts), and the measured
    parts it predicts: the accept length and the time of a drafted round."""
    tokens = sum(len(r.tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    forwards = sum(r.forwards for r in results)
    stats = {"generations": len(results), "tokens": tokens, "seconds": seconds,
             "tokens_per_second": tokens_per_second(tokens, seconds), "tau": tau(tokens, forwards),
             "mean_accept_length": mean(_rounds(results))}
    return {**stats, **_prediction(results, report)} if report and results else stats


def _prediction(results: list[Result], report: dict) -> dict:
    rounds = [s for r in results for s in r.steps if s.step > 0]
    predicted_s = sum(expected_seconds(report, r.prompt_tokens, len(r.tokens)) for r in results)
    c = report["chosen"]
    round_s = Costs.from_json(report["costs"]).round_cost(c["total_tokens"], c["depth"], c["top_k"], c["draft_vocab"])
    return {"predicted_tokens_per_second": tokens_per_second(sum(len(r.tokens) for r in results), predicted_s),
            "predicted_accept_length": report["expected_accept_length"], "predicted_round_ms": 1000 * round_s,
            "round_ms": 1000 * mean([sum(s.timings.values()) for s in rounds])}


def _reference(by_mode: dict[str, dict], bench: Bench, kind: str, dtype: str) -> str | None:
    """The label of the first mode of `kind` at `dtype` that has results."""
    return next((sp.label for sp in bench.specs if sp.kind == kind and bench.dtype(sp) == dtype
                 and by_mode.get(sp.label, {}).get("generations")), None)


def fastest(by_mode: dict[str, dict], bench: Bench, kind: str) -> str | None:
    """The label of the fastest mode of `kind` (any dtype) that has results: the honest baseline."""
    runs = [sp.label for sp in bench.specs if sp.kind == kind and by_mode.get(sp.label, {}).get("generations")]
    return max(runs, key=lambda m: by_mode[m]["tokens_per_second"], default=None)


# summary key -> the baseline kind each speed-up is against (the fastest of it run here)
SPEEDUP_KEYS = {"speedup": "vanilla", "speedup_vs_hf": "hf", "speedup_vs_pld": "hf_pld"}


def _with_speedups(by_mode: dict[str, dict], bench: Bench,
                   baselines: dict[str, str | None]) -> dict[str, dict]:
    """speedup / speedup_vs_hf / speedup_vs_pld: against the fastest vanilla, HF generate and HF prompt
    lookup of the run, whatever their dtype; speedup_same_dtype: against vanilla at the mode's own
    dtype (what precision alone costs or gains). `baselines`: kind -> label, chosen on the whole run
    (a category is compared with the same baselines, not with whichever was faster on it alone)."""
    def ratio(s: dict, ref: str | None) -> float:
        return speedup(s["tokens_per_second"], by_mode[ref]["tokens_per_second"] if ref else math.nan)
    for spec in bench.specs:
        s, dtype = by_mode[spec.label], bench.dtype(spec)
        s["dtype"] = dtype
        for key, kind in SPEEDUP_KEYS.items():
            s[key] = ratio(s, baselines[kind])
        s["speedup_same_dtype"] = ratio(s, _reference(by_mode, bench, "vanilla", dtype))
        s.setdefault("predicted_tokens_per_second", math.nan)
    return by_mode


def predictions_line(by_mode: dict[str, dict]) -> str | None:
    """The auto budget's cost model against this run: predicted beside measured tokens/s per tuned mode,
    and the two parts it predicts (accept length per round, ms per drafted round at the reference
    context), so a miss says which part missed."""
    rows = [f"{m}: predicted {s['predicted_tokens_per_second']:.2f} tok/s (accept {s['predicted_accept_length']:.2f}, "
            f"{s['predicted_round_ms']:.1f} ms/round), measured {s['tokens_per_second']:.2f} (accept "
            f"{s['mean_accept_length']:.2f}, {s['round_ms']:.1f} ms/round): "
            f"{100 * (s['tokens_per_second'] / s['predicted_tokens_per_second'] - 1):+.1f} %"
            for m, s in by_mode.items() if not math.isnan(s.get("predicted_tokens_per_second", math.nan))
            and s.get("generations")]
    return "auto's cost model: " + "; ".join(rows) if rows else None


def baselines_line(baselines: dict[str, str | None], by_mode: dict[str, dict]) -> str:
    """Names what every speed-up of the run is against, e.g. "vs vanilla@float32 (26.9 tok/s)"."""
    named = [f"{kind}: {label} ({by_mode[label]['tokens_per_second']:.2f} tok/s)"
             for kind, label in baselines.items() if label]
    return "speed-ups are against the fastest run of each baseline here: " + ("; ".join(named) or "none run")


def divergences(results: list[Result], bench: Bench) -> list[dict]:
    """Greedy generations of a decoder or hf mode that differ from vanilla at the same dtype: where,
    and the target's top-2 logit gap there (a flip at a near-tie is a precision effect, see
    eagle.core.lossless). One entry per differing generation."""
    by_label = {sp.label: sp for sp in bench.specs}
    refs = {bench.dtype(sp): sp.label for sp in reversed(bench.specs) if sp.kind == "vanilla"}
    ref_tokens = {(r.mode, r.question_id, r.turn): r.tokens for r in results if r.mode in refs.values()}
    out = []
    for r in results:
        spec = by_label[r.mode]
        ref_label = refs.get(bench.dtype(spec))
        ref = ref_tokens.get((ref_label, r.question_id, r.turn))
        if ref is None or r.mode == ref_label:
            continue
        pos = first_divergence(r.tokens, ref)
        if pos is None:
            continue
        target = bench.pair(spec).target
        ids = encode_prompt(target.tokenizer, r.messages, target.max_context)
        gap = logit_gap_at(target, ids, ref, pos) if pos < len(ref) else math.nan
        out.append({"mode": r.mode, "dtype": bench.dtype(spec), "question_id": r.question_id, "turn": r.turn,
                    "position": pos, "top2_logit_gap": gap,
                    "near_tie": is_precision_flip(target.dtype, gap) if not math.isnan(gap) else False})
    return out


def mismatches(results: list[Result], bench: Bench, found: list[dict]) -> dict[str, int]:
    """Per mode with a same-dtype vanilla reference: how many generations differ from it."""
    refs = {bench.dtype(sp) for sp in bench.specs if sp.kind == "vanilla"}
    counts = {sp.label: 0 for sp in bench.specs if sp.kind != "vanilla" and bench.dtype(sp) in refs
              and any(r.mode == sp.label for r in results)}
    for d in found:
        counts[d["mode"]] += 1
    return counts


def summarize(results: list[Result], bench: Bench, greedy: bool) -> dict:
    labels = [s.label for s in bench.specs]
    by_mode = {m: mode_stats([r for r in results if r.mode == m], bench.predicted.get(m)) for m in labels}
    baselines = {kind: fastest(by_mode, bench, kind) for kind in SPEEDUP_KEYS.values()}
    cats = sorted({r.category for r in results})
    by_cat = {c: _with_speedups({m: mode_stats([r for r in results if r.mode == m and r.category == c],
                                               bench.predicted.get(m))
                                 for m in labels}, bench, baselines) for c in cats}
    found = divergences(results, bench) if greedy else []
    return {"modes": _with_speedups(by_mode, bench, baselines), "baselines": baselines, "categories": by_cat,
            "questions": len({r.question_id for r in results}), "generations": len(results),
            "mismatches": mismatches(results, bench, found) if greedy else None, "divergences": found}


def steps_table(results: list[Result], configs: dict[str, dict]):
    """One row per step (an hf generation is one row); pandas only here, for the Parquet file."""
    import pandas as pd
    rows = []
    for r in results:
        cfg = configs.get(r.mode, {})
        for s in r.steps:
            rows.append({"question_id": str(r.question_id), "category": r.category, "turn": r.turn,
                         "mode": r.mode, "kind": s.mode, "step": s.step, "accept_length": s.accept_length,
                         "new_tokens": len(s.new_tokens), "target_forwards": s.target_forwards,
                         "drafted": max(0, len(s.nodes) - 1), "verified": sum(n.kept for n in s.nodes[1:]),
                         **{f"t_{k}": phase_seconds(s.timings, k) for k in (*STEP_PHASES, "generate")},
                         "finished": s.finished, **{k: cfg.get(k) for k in (*BUDGET_FIELDS, "temperature")}})
    return pd.DataFrame(rows)


def _clean(obj):
    """NaN -> None, so the JSON is strict (json.dumps would write NaN)."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else round(obj, 6)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_outputs(plan: Plan, results: list[Result], summary: dict, configs: dict[str, dict]) -> None:
    plan.out.mkdir(parents=True, exist_ok=True)
    table = steps_table(results, configs)
    parquet = io.BytesIO()
    table.to_parquet(parquet, index=False)
    atomic_write(plan.out / "steps.parquet", parquet.getvalue())
    atomic_write(plan.out / "summary.json", json.dumps(_clean(summary), indent=2, ensure_ascii=False))
    atomic_write(plan.out / "summary.md", summary_markdown(summary))


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


# (header, stats key, format); the "vs" columns are against the fastest run of each baseline (any
# dtype, named under the table), "vs same dtype" against vanilla at the mode's own dtype
COLUMNS = (("dtype", "dtype", "s"), ("gens", "generations", "d"), ("tokens", "tokens", "d"),
           ("wall s", "seconds", ".1f"), ("tok/s", "tokens_per_second", ".2f"), ("vs vanilla", "speedup", ".3f"),
           ("vs hf", "speedup_vs_hf", ".3f"), ("vs pld", "speedup_vs_pld", ".3f"),
           ("vs same dtype", "speedup_same_dtype", ".3f"), ("tau", "tau", ".2f"), ("acc len", "mean_accept_length", ".2f"))


def _cells(s: dict) -> list[str]:
    return [_fmt(s.get(key), spec) for _, key, spec in COLUMNS]


def format_table(by_mode: dict[str, dict], first: str = "mode") -> str:
    widths = [max(len(h), 8) for h, _, _ in COLUMNS]
    head = f"{first:<24} " + " ".join(f"{h:>{w}}" for (h, _, _), w in zip(COLUMNS, widths))
    lines = [head, "-" * len(head)]
    for name, s in by_mode.items():
        lines.append(f"{name:<24} " + " ".join(f"{c:>{w}}" for c, w in zip(_cells(s), widths)))
    return "\n".join(lines)


def modes_markdown(by_mode: dict[str, dict]) -> str:
    return markdown_table(["mode", *(h for h, _, _ in COLUMNS)],
                          ([f"`{name}`", *_cells(s)] for name, s in by_mode.items()))


def summary_markdown(summary: dict) -> str:
    parts = [f"questions {summary['questions']}, generations {summary['generations']}, greedy "
             f"{summary['greedy']}, threads {summary['threads']}, head {summary['head']}",
             "", modes_markdown(summary["modes"]), "", baselines_line(summary["baselines"], summary["modes"])]
    predicted = predictions_line(summary["modes"])
    if predicted:
        parts += ["", predicted]
    for cat, by_mode in summary["categories"].items():
        parts += ["", f"**{cat}**", "", modes_markdown(by_mode)]
    if summary["mismatches"] is not None:
        parts += ["", f"greedy outputs differing from same-dtype vanilla: {summary['mismatches']}"]
        parts += [f"- `{d['mode']}` question {d['question_id']} turn {d['turn']}: token {d['position']}, "
                  f"top-2 logit gap {_fmt(d['top2_logit_gap'], '.3f')}" for d in summary["divergences"]]
    return "\n".join(parts) + "\n"


def print_report(summary: dict) -> None:
    print(format_table(summary["modes"]))
    print(baselines_line(summary["baselines"], summary["modes"]))
    predicted = predictions_line(summary["modes"])
    if predicted:
        print(predicted)
    for cat, by_mode in summary["categories"].items():
        print(f"\n[{cat}]")
        print(format_table(by_mode))
    if summary["mismatches"] is not None:
        print(f"\ngreedy outputs differing from same-dtype vanilla (generations): {summary['mismatches']}")
        for d in summary["divergences"]:
            print(f"  {d['mode']} q{d['question_id']} turn {d['turn']}: first differs at token {d['position']}, "
                  f"top-2 logit gap {_fmt(d['top2_logit_gap'], '.3f')}{' (near-tie)' if d['near_tie'] else ''}")


def json_line(summary: dict) -> str:
    keys = ("dtype", "tau", "speedup", "tokens_per_second", "predicted_tokens_per_second", "speedup_vs_hf",
            "speedup_vs_pld", "speedup_same_dtype",
            "mean_accept_length", "tokens", "seconds", "generations")
    mism = summary["mismatches"] or {}
    predicted = ("predicted_accept_length", "predicted_round_ms", "round_ms")  # tuned modes only
    modes = {m: {**{k: s[k] for k in keys}, **{k: s[k] for k in predicted if k in s}, "mismatches": mism.get(m) if summary["mismatches"] is not None else None}
             for m, s in summary["modes"].items()}
    extra = {k: summary.get(k) for k in ("questions", "generations", "turns", "greedy", "mismatches", "divergences",
                                         "skipped_records", "resumed", "out", "head", "threads", "budget", "dtype", "baselines")}
    return json.dumps(_clean({"modes": modes, **extra}))


LATEST = "LATEST"  # the link to the newest default-out run


# ---- command line -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m eagle bench", epilog=KNOBS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Benchmark decoding modes on a question set, interleaved.")
    p.add_argument("--dataset", required=True, help="mt_bench or a JSONL file (question_id, category, turns)")
    p.add_argument("--modes", default="vanilla,static,dynamic,hf,hf_pld",
                   help="comma list of vanilla, static, dynamic, hf, hf_pld (default: %(default)s); a decoder "
                        "mode may carry a budget, dynamic:TOTAL/DEPTH/TOP_K[/DRAFT_VOCAB], dynamic:auto or "
                        "dynamic:adaptive; any mode may carry a dtype, e.g. hf@float32 (default: --dtype). A plain "
                        "dynamic has generate's tree: the auto budget on a CPU unless --preset, a tree flag or "
                        "--budget fixed is given, the fixed tree otherwise; each mode's tree is printed at start")
    p.add_argument("--baselines", choices=("fastest", "same"), default="fastest",
                   help="fastest (default): vanilla, hf and hf_pld given without a dtype also run in every other "
                        "precision this device runs, and every speed-up is against the fastest of each; same: "
                        "only in the run's dtype")
    p.add_argument("--limit", type=int, default=None, help="first N questions")
    p.add_argument("--per-category", type=int, default=None,
                   help="first N questions of each category (MT-bench's first 10 are all writing)")
    p.add_argument("--turns", type=int, choices=(1, 2), default=1, help="2: also the second turn")
    p.add_argument("--out", type=Path, default=None,
                   help="results dir (default runs/bench/<timestamp>, and runs/bench/LATEST links to it)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a summary.json in --out that bench did not write (refused otherwise)")
    p.add_argument("--export", choices=("spec-bench",), default=None,
                   help="spec-bench: also write Spec-Bench answer files (OUT/spec-bench/<model>-<mode>.jsonl) "
                        "and print Spec-Bench's per-question mean speed-up beside ours")
    add_decode_args(p)
    return p


def build_configs(args: argparse.Namespace, specs: list[ModeSpec], bench_pairs: dict[str, Pair],
                  default_dtype: str) -> tuple[dict, dict | None, dict, dict[str, dict]]:
    """One DecodeConfig per mode label (hf modes keep the sampling fields), the auto-budget report
    (or None) and the adaptive modes' round costs. dynamic:auto, and a plain dynamic wherever generate
    would use auto (see _tuned), take the auto budget; dynamic:adaptive its shape with a per-round
    size; and per tuned mode the auto report its budget came from (at the mode's dtype: the summary
    sets what it predicts beside what the mode measured)."""
    configs, costs, report, predicted = {}, {}, None, {}
    for spec in specs:
        pair = bench_pairs[spec.dtype or default_dtype]
        target, head = pair.target, pair.head
        cfg = config_from_args(args, spec.kind if spec.kind in MODES else "vanilla").with_(**dict(spec.overrides))
        if _tuned(args, spec, target.device.type):
            budget = spec.budget if spec.budget != "fixed" else "auto"
            cfg, round_costs, report = tuned_config(target, head, cfg, budget)
            if round_costs is not None:
                costs[spec.label] = round_costs
            predicted[spec.label] = report
            print(f"{spec.label}: {asdict(cfg) if round_costs else report['chosen']}, auto expects "
                  f"{report['expected_speedup']:.2f}x {vanilla_name(report)}", file=sys.stderr)
        elif spec.kind in ("static", "dynamic"):
            print(f"{spec.label}: fixed tree {cfg.total_tokens}/{cfg.depth}/{cfg.top_k}/{cfg.draft_vocab} "
                  "(total/depth/top_k/draft vocab)", file=sys.stderr)
        no_counts = head is not None and cfg.draft_vocab and head.draft_vocab_ids(cfg.draft_vocab) is None
        if spec.kind in ("static", "dynamic") and no_counts:
            print(f"note: {spec.label}: the head has no token counts, so draft_vocab {cfg.draft_vocab} "
                  "falls back to the full vocabulary", file=sys.stderr)
        configs[spec.label] = cfg
    return configs, report, costs, predicted


def _tuned(args: argparse.Namespace, spec: ModeSpec, device_type: str) -> bool:
    """Whether a mode's tree comes from the auto budget: dynamic:auto|adaptive, and a plain `dynamic`
    wherever `generate --mode dynamic` would use auto with the same flags (a CPU, no --preset, no tree
    flag, no --budget fixed), so the two commands decode the same tree."""
    if spec.budget != "fixed":
        return True
    return spec.kind == "dynamic" and not spec.overrides and budget_mode(args, "dynamic", device_type) == "auto"


def load_pairs(args: argparse.Namespace, specs: list[ModeSpec],
               loaded: dict[str, Pair] | None = None) -> tuple[dict[str, Pair], str]:
    """The run's pair at --dtype, plus one per other dtype a mode asks for (same model and head);
    pairs already `loaded` are kept (the first of them is the run's)."""
    need_head = any(s.kind in ("static", "dynamic") for s in specs)
    if loaded:  # the other dtypes load the head the first pair found (no second hub lookup)
        default, pairs = next(iter(loaded)), dict(loaded)
        spec = ModelSpec(str(args.model), pairs[default].source if need_head else None, args.device, default)
    else:
        spec = model_spec(DecodeSettings.from_args(args), need_head)
        target, head, source = load_pair(spec)
        default = dtype_name(target.dtype)
        pairs = {default: Pair(target, head, source, head_sha256(head) if head is not None else None)}
    for dtype in sorted({s.dtype for s in specs if s.dtype and s.dtype not in pairs}):
        other, other_head, other_source = load_pair(replace(spec, dtype=dtype))
        pairs[dtype] = Pair(other, other_head, other_source,
                            head_sha256(other_head) if other_head is not None else None)
    return pairs, default


def _check_budget_flag(budget: str | None, specs: list[ModeSpec]) -> None:
    """bench applies --budget auto to its dynamic modes; anything else it would silently ignore."""
    if budget == "adaptive":
        raise ValueError("bench --budget adaptive: name the mode dynamic:adaptive in --modes instead")
    if budget == "auto" and not any(s.kind == "dynamic" for s in specs):
        raise ValueError("--budget auto sizes dynamic trees, but --modes has no dynamic mode")


SUMMARY_KINDS = {"modes": "dict", "configs": "dict", "generations": "nat"}
# Each mode's figures: null where undefined (no baseline, NaN), else a finite number >= 0.
MODE_FIGURES = ("tau", "speedup", "tokens_per_second", "mean_accept_length", "tokens", "seconds")


def read_summary(path: Path) -> dict:
    """A bench summary.json (what the dashboard shows and `bench` refuses to overwrite unless it wrote it):
    an object with modes, configs and generations, each mode's figures null or a number >= 0."""
    summary = check_object(read_json_object(path, "bench summary"), path, "summary", SUMMARY_KINDS)
    for mode, figures in summary["modes"].items():
        check_object(figures, path, f"modes[{mode!r}]", {}, {k: "nonneg?" for k in MODE_FIGURES})
    return summary


def _check_summary_owner(out: Path, overwrite: bool) -> None:
    """bench rewrites its own summary.json from its traces; one it did not write is the user's."""
    path = out / "summary.json"
    if path.exists() and not overwrite:
        try:
            read_summary(path)
        except (FileFormatError, OSError) as err:
            raise ValueError(f"{path} was not written by bench ({err}): move it, use another --out, or pass "
                             "--overwrite to replace it") from None


def _bench(args: argparse.Namespace) -> int:
    """Every check that needs no model, then the run under the --out lock."""
    check_runtime_args(args)
    questions, bad = load_questions(args.dataset)
    if bad:
        print(f"skipped {bad} bad record(s) in {args.dataset}", file=sys.stderr)
    questions = select_questions(questions, args.limit, args.per_category)
    if not questions:
        raise ValueError(f"{args.dataset} holds no usable question")
    specs = parse_modes(args.modes)
    _check_budget_flag(args.budget, specs)
    settings = DecodeSettings.from_args(args)
    settings.validate(flag_name)  # the decode flags, checked as generate checks them
    out = args.out or Path("runs") / "bench" / time.strftime("%Y%m%d-%H%M%S")
    check_output(out, "--out", directory=True)
    _check_summary_owner(out, args.overwrite)
    check_local_paths(settings, any(s.kind in ("static", "dynamic") for s in specs))  # before --out is made
    out.mkdir(parents=True, exist_ok=True)
    if args.out is None:
        _point_latest(out)
    with exclusive_lock(out / ".lock", f"bench --out {out}"):
        dataset = args.dataset if args.dataset in DATASETS else str(Path(args.dataset).resolve())
        return _run_locked(args, Plan(questions, args.turns, specs, out, dataset), bad)


def _point_latest(out: Path) -> None:
    """runs/bench/LATEST -> the run just started under the default --out, swapped atomically (what
    `analysis figures --traces runs/bench/LATEST` reads); a LATEST that is not our link is left alone."""
    link = out.parent / LATEST
    if link.exists() and not link.is_symlink():
        print(f"note: {link} is not a link bench made; left as it is", file=sys.stderr)
        return
    tmp = out.parent / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(out.name, tmp)
    os.replace(tmp, link)


def _run_locked(args: argparse.Namespace, plan: Plan, bad: int) -> int:
    pairs, default_dtype = load_pairs(args, plan.specs)
    if args.baselines == "fastest":
        plan.specs = with_baselines(plan.specs, default_dtype, runnable_dtypes(pairs[default_dtype].target.device))
        pairs, default_dtype = load_pairs(args, plan.specs, pairs)
    configs, budget_report, costs, predicted = build_configs(args, plan.specs, pairs, default_dtype)
    bench = Bench(pairs, default_dtype, configs, plan.specs, costs, predicted)
    by_id = {q.question_id: q for q in plan.questions}
    if args.export == "spec-bench":  # before anything is written: the export must not mix unlike runs
        check_same_run(plan.out, {s.label for s in plan.specs}, _run_settings(bench, plan, default_dtype))
    done: dict[Key, Result] = {}
    for spec in plan.specs:
        want = Expected(spec.label, bench.config_dict(spec), bench.pair(spec).target.name, bench.head_sha(spec), by_id)
        done.update(load_store(plan.trace_path(spec), want))
    resumed = sum(k in done for k in plan.keys())
    if resumed:
        print(f"resuming: {resumed} generation(s) already in {plan.out}", file=sys.stderr)
    try:
        run_plan(bench, plan, done)
    finally:  # an interrupted run still leaves tables of what finished
        results = [done[k] for k in plan.keys() if k in done]
        greedy = configs[plan.specs[0].label].greedy
        summary = {**summarize(results, bench, greedy), "turns": args.turns, "greedy": greedy,
                   "skipped_records": bad, "resumed": resumed, "out": str(plan.out), "head": bench.head_source,
                   "head_sha": bench.pairs[default_dtype].head_sha, "threads": torch.get_num_threads(),
                   "dataset": str(args.dataset), "budget": budget_report, "dtype": default_dtype,
                   "configs": {s.label: bench.config_dict(s) for s in plan.specs}}
        write_outputs(plan, results, summary, summary["configs"])
    print_report(summary)
    if args.export == "spec-bench":
        tokenizer = bench.pairs[default_dtype].target.tokenizer  # speed.py recounts the baseline with it
        files = export_spec_bench(plan.out, tokenizer, frozenset((qid, turn) for qid, turn, _ in plan.keys()))
        print(f"\nSpec-Bench answer files in {plan.out / 'spec-bench'} (per-question mean vs the bench's totals):")
        table, base = speedups(files, tokenizer)
        print(format_speedups(table, summary["modes"], base))
    if args.json:
        print(json_line(summary))
    return _check_lossless(summary, plan.specs)


def _run_settings(bench: Bench, plan: Plan, default_dtype: str) -> RunSettings:
    """What the Spec-Bench export requires every method in --out to share with this run."""
    config = bench.config_dict(plan.specs[0])
    return RunSettings(bench.target.name, {k: config.get(k) for k in RUN_FIELDS}, plan.dataset, default_dtype,
                       bench.pairs[default_dtype].head_sha, {q.question_id: list(q.turns) for q in plan.questions},
                       frozenset((qid, turn) for qid, turn, _ in plan.keys()))


def _check_lossless(summary: dict, specs: list[ModeSpec]) -> int:
    """Greedy speculative decoding must reproduce same-dtype vanilla token for token; below fp32 a
    flip at a near-tie (eagle.core.lossless) is reported but allowed. Any other divergence fails the run."""
    spec_modes = {s.label for s in specs if s.kind in ("static", "dynamic")}
    bad = [d for d in summary["divergences"] if d["mode"] in spec_modes and not d["near_tie"]]
    if bad:
        print(f"error: greedy outputs differ from vanilla beyond a near-tie: {bad}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_guarded(lambda: _main(argv), "interrupted: finished generations are kept; rerun with the same "
                                            "--out to resume")


def _main(argv: list[str]) -> int:
    check_argv(argv)
    return _bench(build_parser().parse_args(argv))
