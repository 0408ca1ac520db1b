"""Running a bench: the models (one pair per dtype), one generation of any mode with its trace header,
and the plan, question by question and turn by turn with every mode in turn (interleaved, so a drift
in the machine's load hits every mode alike)."""
from __future__ import annotations

import copy
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ...core.config import DecodeConfig
from ...core.decode import Decoder, generate
from ...core.prompt import encode_prompt
from ...core.detok import TextWindow, next_text, token_text
from ...models.target import Target
from ...records.questions import Question
from ...records.trace import StepRecord, Trace, TraceHeader, append_trace
from ..budget.report import AutoReport
from ..session import Choice, Prepared, Session
from .spec import HF_MODES, PLD_TOKENS, ModeSpec, hf_config

WARMUP_TOKENS = 8
Key = tuple[object, int, str]  # (question_id, turn, mode label)


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
    config: dict = field(default_factory=dict, repr=False)  # as its trace header records it (auto's tree per prompt)


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
    head_sha: str | None = None  # eagle.models.headio.head_sha256 of its weights (checked on resume)


class Bench:
    """The models (one pair per dtype), one runner per mode, and the trace header each generation gets.
    A decoder mode's generation is prepared by Session.prepare, as generate prepares it: under the auto
    budget each prompt gets the tree auto chooses for its context, from the auto report read once per run."""

    def __init__(self, pairs: dict[str, Pair], default_dtype: str, configs: dict[str, DecodeConfig],
                 specs: list[ModeSpec], budgets: dict[str, str] | None = None,
                 predicted: dict[str, AutoReport] | None = None) -> None:
        self.pairs, self.default_dtype, self.specs = pairs, default_dtype, specs
        self.configs = configs  # label -> the settings before the budget policy (hf modes: as run)
        self.budgets = budgets or {}  # label -> "auto" / "adaptive" (tuned modes; the others "fixed")
        self.predicted = predicted or {}  # label -> the auto report its budget came from (tuned modes)
        self._sessions: dict[str, Session] = {}
        self._choices: dict[tuple[str, int | None], Choice] = {}
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

    def budget(self, spec: ModeSpec) -> str:
        return self.budgets.get(spec.label, "fixed")

    def choice(self, spec: ModeSpec, prompt_tokens: int | None) -> Choice:
        """What a decoder mode runs a prompt of `prompt_tokens` tokens with (Session.choose; None: auto's
        reference choice, at its probe's prefix length)."""
        key = (spec.label, prompt_tokens)
        if key not in self._choices:
            self._choices[key] = self.session(spec).choose(self.configs[spec.label], self.budget(spec), prompt_tokens)
        return self._choices[key]

    def config_dict(self, spec: ModeSpec, prompt_tokens: int | None) -> dict:
        """The config a generation of a `prompt_tokens`-token prompt runs with, as its trace header records
        it and resume compares it (None: the mode's reference, what summary.json's configs hold)."""
        if spec.kind in HF_MODES:
            return {**hf_config(self.configs[spec.label], spec.kind), "dtype": self.dtype(spec)}
        choice = self.choice(spec, prompt_tokens)
        # lists, not tuples: the dict must equal its JSON round trip for resume to recognise it
        extra = {"adaptive_costs": choice.costs.to_json()} if choice.costs else {}
        return {**asdict(choice.config), **extra, "dtype": self.dtype(spec)}

    def prepare(self, spec: ModeSpec, prompt: list[dict] | str) -> Prepared | None:
        """A decoder mode's generation of `prompt`, prepared as every front end prepares one; None for an hf mode."""
        if spec.kind in HF_MODES:
            return None
        return self.session(spec).prepare(prompt, self.configs[spec.label], self.budget(spec))

    def run(self, spec: ModeSpec, ids: list[int], prepared: Prepared | None,
            max_new_tokens: int | None = None) -> tuple[list[int], float, int, list[StepRecord]]:
        """One generation (an hf mode's, or the prepared one's) -> tokens, wall seconds, target forwards,
        step records; `max_new_tokens` shortens it (the warm-up)."""
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
        decoder = prepared.decoder
        if max_new_tokens is not None:
            decoder = Decoder(decoder.target, decoder.head, decoder.cfg.with_(max_new_tokens=max_new_tokens),
                              decoder.costs)
        t0 = time.perf_counter()
        g = generate(decoder, ids)
        return g.tokens, time.perf_counter() - t0, g.target_forwards, g.steps

    def header(self, spec: ModeSpec, q: Question, turn: int, messages: list[dict], n_ids: int,
               seconds: float, n_tokens: int, dataset: str | None = None) -> TraceHeader:
        note = self.choice(spec, n_ids).note if spec.kind not in HF_MODES else None
        meta = {"question_id": q.question_id, "category": q.category, "turn": turn, "mode_label": spec.label,
                **({"dataset": dataset} if dataset else {}),
                "seconds": seconds, "new_tokens": n_tokens, "threads": torch.get_num_threads(),
                "head_sha": self.head_sha(spec),  # what resume checks (older stores have no head_version)
                **({"note": note} if note else {})}  # as Session.prepare notes it: auto fell back to vanilla
        return self.session(spec).header(messages, self.config_dict(spec, n_ids), n_ids, **meta)

    def session(self, spec: ModeSpec) -> Session:
        """The pair's session, tuning from the mode's auto report (read once per run) where it has one."""
        dtype = self.dtype(spec)
        if dtype not in self._sessions:  # the head's identity is hashed once per pair
            pair = self.pairs[dtype]
            self._sessions[dtype] = Session.of(pair.target, pair.head, pair.source)
        report = self.predicted.get(spec.label)
        return replace(self._sessions[dtype], auto=report) if report else self._sessions[dtype]


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


def _prepared(bench: Bench, spec: ModeSpec, prompt: list[dict] | str) -> tuple[list[int], Prepared | None]:
    """The prompt's ids, and a decoder mode's prepared generation (Session.prepare)."""
    prepared = bench.prepare(spec, prompt)
    ids = prepared.ids if prepared else encode_prompt(bench.target.tokenizer, prompt, bench.target.max_context)
    return ids, prepared


def _run_one(bench: Bench, plan: Plan, spec: ModeSpec, q: Question, turn: int,
             done: dict[Key, Result]) -> None:
    messages = _messages(bench, q, turn, done, plan.reference.label)
    ids, prepared = _prepared(bench, spec, messages)
    tokens, seconds, forwards, steps = bench.run(spec, ids, prepared)
    header = bench.header(spec, q, turn, messages, len(ids), seconds, len(tokens), plan.dataset)
    append_trace(plan.trace_path(spec), Trace(header, steps))
    done[(q.question_id, turn, spec.label)] = Result(q.question_id, q.category, turn, spec.label, tokens,
                                                     seconds, forwards, steps, messages, len(ids), header.config)


def warm_up(bench: Bench, plan: Plan) -> None:
    """One short generation per mode (of the first prompt's tree), so first-call costs (allocation,
    kernels) stay out of the numbers."""
    for spec in tqdm(plan.specs, desc="warm-up", unit="mode", file=sys.stderr):
        ids, prepared = _prepared(bench, spec, plan.questions[0].turns[0])
        bench.run(spec, ids, prepared, max_new_tokens=WARMUP_TOKENS)


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

