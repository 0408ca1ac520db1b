"""The trace: one record per decoding round, written as JSON lines and read back.

Schema `eagle2-explorer/trace`, version 4. A trace file holds, per generation, a header line, then one
line per round; every record carries the generation's id, so records of two generations never merge:

header: {"schema", "version", "kind": "header", "generation": id, "model", "head",
         "config": DecodeConfig fields, "prompt": str, "prompt_tokens": int, "meta": {...},
         "head_type": "eagle1"|"eagle3"|null, "head_version": head_sha256|null,
         "head_layout": {"name", "convention", "layer_ids", "source"}|null: the checkpoint layout the head
         was read from and how its layer ids read (eagle.models.layouts.HeadLayout; optional: older files lack these)}
step:   {"kind": "step", "generation": id, "step": int, "mode": str, "nodes": [NodeRecord...],
         "accepted": [node ids], "bonus_token": int, "bonus_text": str, "new_tokens": [int],
         "new_text": str, "accept_length": accepted draft tokens + 1,
         "timings": {phase: s}, "target_forwards": int, "finished": str|null}
        timings: the round's disjoint phases, summing to its wall time: "draft.0" .. "draft.d" (one per
        draft step), "tree", "verify" (the target forward), "accept", "commit", "consume", "record"
        (eagle.records.timing.STEP_PHASES; traces before 2026-12-05 hold "draft", "verify", "commit").
        Step 0 is the prefill: no nodes, one new token, timings {"prefill": s}. The last step's
        "finished" says why the generation ended ("eos", "max_new_tokens", "context"), or
        "interrupted" (then the header's meta has "interrupted": true) when it was cut short.
        new_text: what the round adds to the reply's text (eagle.core.detok.next_text): whole characters
        only (a character still incomplete waits for the round that completes it; the last round
        flushes), special tokens such as <|im_end|> left out, so the new_text of a finished
        generation concatenate to tokenizer.decode(tokens, skip_special_tokens=True). An interrupted
        one may lack a trailing partial character. bonus_text is the bonus token's label, as a node's.
node:   {"id": candidate index (0 = root), "parent": id (-1 for the root), "depth": int (root 0),
         "token": int, "text": the token's own label (eagle.core.detok.token_text: special tokens written out;
         a token holding part of a character shows its bytes, undecodable ones as \\xNN, e.g. " \\xf0\\x9f"
         for a space and an emoji's first two bytes; a SentencePiece byte token as its name, "<0xF0>"),
         "confidence": draft probability of this token given its parent,
         "value": product of confidences along the path (EAGLE-2's node value), "rank": rank among its
         siblings by confidence (0 = best), "kept": survived reranking (was verified), "accepted": bool,
         "target_prob": the target's (processed) probability of this token at its parent, or null if
         the node was not verified, "source": "draft" (the head's) or "lookup" (the prompt-lookup
         branch, eagle.core.lookup: copied from the context, confidence and value 1, ids after the drafts)}
The root node is the last token the target produced; its confidence and value are 1.

Writers append a whole generation at once (`append_trace`: one write under a file lock). The reader
keeps every valid record, skips and counts bad lines (wrong JSON, wrong field types, a step whose
generation has no header before it), gives each step to the header of its generation id (so lines of
two generations interleaved in one file still come apart), drops and reports a trace whose steps do
not follow each other (a step number that restarts or goes back, a mode that changes, a step after
the finished one: the signs of two generations mixed without ids) and counts the traces that never
finished. Version 1 files (no generation ids) read as before, each step going to the last header.
Version 3 files (no "source": every node is the head's) and version 2 files read unchanged; version 2's
text fields were each round's and token's own decode, so a
character split across rounds or tokens shows there as U+FFFD and new_text includes special tokens.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from .files import atomic_write, locked_append
from .schema import FileFormatError

SCHEMA, VERSION = "eagle2-explorer/trace", 4
INTERRUPTED = "interrupted"  # the last step's `finished` when the generation was cut short


def new_generation_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass
class NodeRecord:
    id: int
    parent: int
    depth: int
    token: int
    text: str
    confidence: float
    value: float
    rank: int
    kept: bool
    accepted: bool
    target_prob: float | None = None
    source: str = "draft"  # "draft": the head proposed it; "lookup": copied from the context (eagle.core.lookup)


@dataclass
class StepRecord:
    step: int
    mode: str
    nodes: list[NodeRecord]
    accepted: list[int]
    bonus_token: int
    bonus_text: str
    new_tokens: list[int]
    new_text: str
    accept_length: int  # accepted draft tokens + 1 (the bonus), before any truncation at the end
    timings: dict[str, float] = field(default_factory=dict)
    target_forwards: int = 1
    finished: str | None = None  # "eos", "max_new_tokens", "context" on the last round; or INTERRUPTED

    def to_dict(self) -> dict:
        return {"kind": "step", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "StepRecord":
        fields = {k: v for k, v in d.items() if k not in ("kind", "generation")}
        fields["nodes"] = [NodeRecord(**n) for n in fields["nodes"]]
        return cls(**fields)


@dataclass
class TraceHeader:
    model: str
    head: str | None
    config: dict
    prompt: str
    prompt_tokens: int
    meta: dict = field(default_factory=dict)
    generation: str = field(default_factory=new_generation_id)
    head_type: str | None = None  # "eagle1" (EAGLE-1/2 layout) or "eagle3"; None without a head
    head_version: str | None = None  # eagle.models.headio.head_sha256 of the head's weights
    head_layout: dict | None = None  # eagle.models.layouts.HeadLayout.describe(): layout name and layer-id convention

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, "kind": "header", **asdict(self)}


@dataclass
class Trace:
    header: TraceHeader
    steps: list[StepRecord]

    @property
    def interrupted(self) -> bool:
        """No step says the generation finished: it was stopped, killed or cut short."""
        return not self.steps or self.steps[-1].finished in (None, INTERRUPTED)


def mark_interrupted(trace: Trace) -> Trace:
    """Say in the trace itself that it ended early, so no reader takes it for a whole generation."""
    trace.header.meta["interrupted"] = True
    if trace.steps and trace.steps[-1].finished is None:
        trace.steps[-1].finished = INTERRUPTED
    return trace


@dataclass
class ReadReport:
    traces: int = 0
    steps: int = 0
    skipped_lines: int = 0
    errors: list[str] = field(default_factory=list)
    dropped_traces: int = 0  # traces whose steps did not follow each other (mixed generations)
    interrupted: int = 0  # traces kept although they never finished

    def skip(self, lineno: int, why: str, lines: int = 1) -> None:
        self.skipped_lines += lines
        if len(self.errors) < 20:
            self.errors.append(f"line {lineno}: {why}")

    def messages(self, path: str | Path) -> list[str]:
        """One sentence per kind of problem, for a command line or a page to show."""
        out = []
        if self.dropped_traces:
            out.append(f"{path}: dropped {self.dropped_traces} trace(s) whose steps are mixed up "
                       f"(two generations in one trace?); first problem: {self._first('dropped')}")
        bad = self.skipped_lines
        if bad:
            out.append(f"{path}: skipped {bad} bad line(s) in all; first: {self.errors[0]}")
        if self.interrupted:
            out.append(f"{path}: {self.interrupted} of {self.traces} trace(s) were interrupted before they "
                       "finished; they are included as partial generations")
        return out

    def _first(self, word: str) -> str:
        return next((e for e in self.errors if word in e), self.errors[0] if self.errors else "")


class TraceFormatError(FileFormatError):
    """A file is not an eagle2-explorer trace at all (no readable trace in it)."""


def _lines(trace: Trace) -> str:
    gen = trace.header.generation
    records = [trace.header.to_dict()] + [{"kind": "step", "generation": gen, **asdict(s)} for s in trace.steps]
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def write_trace(path: str | Path, traces: Iterable[Trace]) -> None:
    """Write traces atomically (eagle.records.files.atomic_write): a crash never leaves a half-written file."""
    atomic_write(path, "".join(_lines(t) for t in traces))


def append_trace(path: str | Path, trace: Trace) -> None:
    """Append one whole generation with a single write under an exclusive lock, on a fresh line
    (eagle.records.files.locked_append): concurrent writers never interleave and a torn line stays apart."""
    locked_append(path, _lines(trace).encode("utf-8"))


# ---- reading --------------------------------------------------------------------------------
# Field -> kind of every record; checked on read so that no consumer meets a null confidence or a
# string where a number belongs (a record that fails is skipped and counted, never half-used).
HEADER_FIELDS = {"model": "str", "head": "str?", "config": "dict", "prompt": "str", "prompt_tokens": "int"}
HEADER_OPTIONAL = {"schema": "str", "version": "int", "kind": "str", "meta": "dict", "generation": "str",
                   "head_type": "str?", "head_version": "str?", "head_layout": "dict?"}
STEP_FIELDS = {"step": "int", "mode": "str", "nodes": "list", "accepted": "ints", "bonus_token": "int",
               "bonus_text": "str", "new_tokens": "ints", "new_text": "str", "accept_length": "int"}
STEP_OPTIONAL = {"kind": "str", "generation": "str", "timings": "numdict", "target_forwards": "int",
                 "finished": "str?"}
NODE_FIELDS = {"id": "int", "parent": "int", "depth": "int", "token": "int", "text": "str", "confidence": "num",
               "value": "num", "rank": "int", "kept": "bool", "accepted": "bool"}
NODE_OPTIONAL = {"target_prob": "num?", "source": "str"}
_TYPES = {"int": int, "str": str, "bool": bool, "dict": dict, "list": list}


def _is(value: object, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _is(value, kind[:-1])
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "ints":
        return isinstance(value, list) and all(type(v) is int for v in value)
    if kind == "numdict":
        return isinstance(value, dict) and all(_is(v, "num") for v in value.values())
    return type(value) is _TYPES[kind]  # `type is`: a bool is not an int here


def _check_fields(obj: dict, required: dict[str, str], optional: dict[str, str], record: type,
                  what: str) -> None:
    """Required fields present, known ones of the right kind; a field of the record's dataclass
    that the tables do not list yet (added by a newer writer) passes unchecked, any other is refused."""
    for name in required:
        if name not in obj:
            raise ValueError(f"{what} lacks the field {name!r}")
    for name, value in obj.items():
        kind = required.get(name) or optional.get(name)
        if kind is None and name in record.__dataclass_fields__:
            continue
        if kind is None:
            raise ValueError(f"{what} has an unknown field {name!r}")
        if not _is(value, kind):
            raise ValueError(f"{what} field {name!r} is {value!r:.40}, expected {kind.rstrip('?')}"
                             f"{' or null' if kind.endswith('?') else ''}")


def _parse(line: str) -> TraceHeader | tuple[str | None, StepRecord]:
    """One line -> a header, or (generation id or None for version 1, step); ValueError if invalid."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if obj.get("kind") == "header":
        _check_schema(obj)
        _check_fields(obj, HEADER_FIELDS, HEADER_OPTIONAL, TraceHeader, "header")
        fields = {k: obj[k] for k in HEADER_FIELDS}
        return TraceHeader(**fields, meta=obj.get("meta", {}), generation=obj.get("generation", ""),
                           head_type=obj.get("head_type"), head_version=obj.get("head_version"),
                           head_layout=obj.get("head_layout"))
    if obj.get("kind") == "step":
        _check_fields(obj, STEP_FIELDS, STEP_OPTIONAL, StepRecord, "step")
        for node in obj["nodes"]:
            if not isinstance(node, dict):
                raise ValueError("step has a node that is not an object")
            _check_fields(node, NODE_FIELDS, NODE_OPTIONAL, NodeRecord, f"step {obj['step']} node")
        return obj.get("generation") or None, StepRecord.from_dict(obj)  # "" (a rewritten v1 trace): no id
    raise ValueError(f"unknown record kind {obj.get('kind')!r}")


def _check_schema(obj: dict) -> None:
    if obj.get("schema") != SCHEMA:
        raise ValueError(f"schema {obj.get('schema')!r} is not {SCHEMA!r}")
    if not isinstance(obj.get("version", 0), int) or obj.get("version", 0) > VERSION:
        raise ValueError(f"trace version {obj.get('version')!r} is newer than this reader ({VERSION})")


@dataclass
class _Open:
    """The trace being read: where its header was, how many lines it has, and why it is dropped."""
    trace: Trace
    lineno: int
    lines: int = 1
    broken: str | None = None


def _sequence_break(prev: StepRecord | None, step: StepRecord) -> str | None:
    """Why `step` cannot follow `prev` in one generation (None if it can)."""
    if prev is None:
        return None
    if prev.finished is not None:
        return f"step {step.step} comes after the generation finished at step {prev.step}"
    if step.step <= prev.step:
        return f"step numbers go {prev.step} -> {step.step}"
    if step.mode != prev.mode:
        return f"the mode changes from {prev.mode!r} to {step.mode!r}"
    return None


def _owner(opened: dict[str, _Open], last: _Open | None, generation: str | None) -> _Open | str:
    """The open trace a step belongs to, or why it belongs to none. A step with a generation id goes
    to the header with that id wherever it is in the file (so two generations interleaved line by
    line still come apart); a version-1 step, which has no id, to the last header before it."""
    if generation is None:
        return last if last is not None else "step before any header"
    if generation in opened:
        return opened[generation]
    return f"a step of generation {generation}, whose header is not before it"


def _add_step(owner: _Open, step: StepRecord, lineno: int) -> None:
    owner.lines += 1
    if owner.broken is None:
        why = _sequence_break(owner.trace.steps[-1] if owner.trace.steps else None, step)
        if why is None:
            owner.trace.steps.append(step)
        else:
            owner.broken = f"line {lineno}: {why}"


def _close(current: _Open, traces: list[Trace], report: ReadReport) -> None:
    if current.broken is None:
        traces.append(current.trace)
        return
    report.dropped_traces += 1
    report.skip(current.lineno, f"trace dropped with its {current.lines} line(s): {current.broken}",
                current.lines)


def read_trace(path: str | Path) -> tuple[list[Trace], ReadReport]:
    """Read every complete, valid record; count (and describe) the lines that were skipped and the
    traces that were dropped as mixed or counted as interrupted. Traces come in header order."""
    report = ReadReport()
    order: list[_Open] = []
    opened: dict[str, _Open] = {}  # generation id -> its trace (a repeated id: the later header)
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = _parse(line)
            except (ValueError, TypeError, KeyError) as err:
                report.skip(lineno, str(err))
                continue
            if isinstance(record, TraceHeader):
                order.append(_Open(Trace(record, []), lineno))
                if record.generation:
                    opened[record.generation] = order[-1]
                continue
            owner = _owner(opened, order[-1] if order else None, record[0])
            if isinstance(owner, str):
                report.skip(lineno, owner)
            else:
                _add_step(owner, record[1], lineno)
    traces: list[Trace] = []
    for current in order:
        _close(current, traces, report)
    if not traces and report.skipped_lines:
        raise TraceFormatError(f"{path} holds no readable trace ({report.skipped_lines} bad lines; "
                               f"first: {report.errors[0]})")
    report.traces, report.steps = len(traces), sum(len(t.steps) for t in traces)
    report.interrupted = sum(t.interrupted for t in traces)
    return traces, report

