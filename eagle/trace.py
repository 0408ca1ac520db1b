"""The trace: one record per decoding round, written as JSON lines and read back.

Schema `eagle2-explorer/trace`, version 1. A trace file holds a header line, then one line per round:

header: {"schema", "version", "kind": "header", "model", "head", "config": DecodeConfig fields,
         "prompt": str, "prompt_tokens": int, "meta": {...}}
step:   {"kind": "step", "step": int, "mode": str, "nodes": [NodeRecord...], "accepted": [node ids],
         "bonus_token": int, "bonus_text": str, "new_tokens": [int], "new_text": str,
         "accept_length": accepted draft tokens + 1, "timings": {"draft": s, "verify": s, "commit": s},
         "target_forwards": int, "finished": str|null}
        Step 0 is the prefill: no nodes, one new token, timings {"prefill": s}.
node:   {"id": candidate index (0 = root), "parent": id (-1 for the root), "depth": int (root 0),
         "token": int, "text": str, "confidence": draft probability of this token given its parent,
         "value": product of confidences along the path (EAGLE-2's node value), "rank": rank among its
         siblings by confidence (0 = best), "kept": survived reranking (was verified), "accepted": bool,
         "target_prob": the target's (processed) probability of this token at its parent, or null if
         the node was not verified}
The root node is the last token the target produced; its confidence and value are 1.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from .files import atomic_write

SCHEMA, VERSION = "eagle2-explorer/trace", 1


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
    finished: str | None = None  # "eos", "max_new_tokens", "context" on the last round

    def to_dict(self) -> dict:
        return {"kind": "step", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "StepRecord":
        fields = {k: v for k, v in d.items() if k != "kind"}
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

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, "kind": "header", **asdict(self)}


@dataclass
class Trace:
    header: TraceHeader
    steps: list[StepRecord]


@dataclass
class ReadReport:
    traces: int = 0
    steps: int = 0
    skipped_lines: int = 0
    errors: list[str] = field(default_factory=list)


class TraceFormatError(ValueError):
    """A file is not an eagle2-explorer trace at all."""


def write_trace(path: str | Path, traces: Iterable[Trace]) -> None:
    """Write traces atomically (temp file + rename): a crash never leaves a half-written file."""
    lines = []
    for trace in traces:
        lines.append(json.dumps(trace.header.to_dict(), ensure_ascii=False) + "\n")
        lines += [json.dumps(step.to_dict(), ensure_ascii=False) + "\n" for step in trace.steps]
    atomic_write(path, "".join(lines))


class TraceWriter:
    """Appends records as they come (for live generation); each line is flushed whole."""

    def __init__(self, path: str | Path) -> None:
        self._f = open(path, "a", encoding="utf-8")

    def header(self, header: TraceHeader) -> None:
        self._write(header.to_dict())

    def step(self, step: StepRecord) -> None:
        self._write(step.to_dict())

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_trace(path: str | Path) -> tuple[list[Trace], ReadReport]:
    """Read every complete, valid record; count (and describe) the lines that were skipped."""
    report = ReadReport()
    traces: list[Trace] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                _read_line(line, lineno, traces, report)
    if not traces and report.skipped_lines:
        raise TraceFormatError(f"{path} holds no readable trace ({report.skipped_lines} bad lines; "
                               f"first: {report.errors[0]})")
    report.traces, report.steps = len(traces), sum(len(t.steps) for t in traces)
    return traces, report


def _read_line(line: str, lineno: int, traces: list[Trace], report: ReadReport) -> None:
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        if obj.get("kind") == "header":
            _check_schema(obj)
            fields = {k: obj[k] for k in ("model", "head", "config", "prompt", "prompt_tokens")}
            traces.append(Trace(TraceHeader(**fields, meta=obj.get("meta", {})), []))
        elif obj.get("kind") == "step":
            if not traces:
                raise ValueError("step before any header")
            traces[-1].steps.append(StepRecord.from_dict(obj))
        else:
            raise ValueError(f"unknown record kind {obj.get('kind')!r}")
    except (ValueError, TypeError, KeyError) as err:
        report.skipped_lines += 1
        if len(report.errors) < 20:
            report.errors.append(f"line {lineno}: {err}")


def _check_schema(obj: dict) -> None:
    if obj.get("schema") != SCHEMA:
        raise ValueError(f"schema {obj.get('schema')!r} is not {SCHEMA!r}")
    if obj.get("version", 0) > VERSION:
        raise ValueError(f"trace version {obj['version']} is newer than this reader ({VERSION})")


def iter_steps(traces: list[Trace]) -> Iterator[tuple[int, StepRecord]]:
    for i, trace in enumerate(traces):
        for step in trace.steps:
            yield i, step
