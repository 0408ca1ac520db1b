"""The trace store a bench resumes from: each mode's finished generations in --out, reused only when
made with this run's settings, model, head weights and question text (else refused, naming what
differs); a malformed stored header is skipped and generated again."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...records.files import cut_torn_tail
from ...records.schema import FileFormatError, check_object, check_value
from ...records.trace import Trace, read_trace
from .run import Key, Result


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
                  int(trace.header.prompt_tokens or 0), trace.header.config)


@dataclass(frozen=True)
class Expected:
    """What a stored generation must have been made with for this run to reuse it."""
    label: str
    config: Callable[[int], dict]  # prompt tokens -> the config this run gives such a prompt (auto: per context)
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
    diff = _first_difference(h.config, want.config(int(h.prompt_tokens or 0)))
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

