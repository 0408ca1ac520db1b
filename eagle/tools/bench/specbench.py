"""Spec-Bench answer files from an `eagle bench` run, and Spec-Bench's speed-up.

Spec-Bench (hemingkx/Spec-Bench) keeps one JSONL answer file per method; each line is one question:
question_id, category, answer_id, model_id, tstamp and choices = [{index, turns (the reply text per turn),
decoding_steps, new_tokens and wall_time (one entry per turn), accept_lengths (one per decoding round, all
turns together)}]. Its evaluation/speed.py scores a method by the mean over questions of
sum(new_tokens) / sum(wall_time), and the speed-up as that mean over the baseline's (whose tokens it
recounts, below); the bench table's tok/s (all tokens over all seconds) weights long answers more, so the
two differ.

Mapping from our traces: turns = the reply text as Spec-Bench's evaluation/eval.py writes it (every
special token's text removed, e.g. the closing <|im_end|>, then stripped); decoding_steps = target forwards
after the prefill; accept_lengths = our accept_length per round (accepted drafts + the bonus token), empty
for HF generate (no rounds to count); wall_time = the bench's wall seconds of the turn's generation.

speed.py takes a method's tokens from new_tokens, but recounts the baseline's from its answer text as
len(tokenizer(turn).input_ids) - 1 per turn, the -1 for a BOS token the tokenizer is assumed to add.
The printed Spec-Bench speed-up follows it to the letter with the target's tokenizer, so it is the figure
speed.py prints for these files, and the printout names the recount and how far it falls from the tokens
generated (for SmolLM2 about two a turn: the <|im_end|> that eval.py strips, and the -1 for a BOS this
tokenizer does not add).
"""
from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ...records.stats import mean_rate, speedup
from ...records.files import atomic_write
from ...records.schema import check_object, check_value, fail
from ...records.trace import Trace, read_trace

SPEC_BENCH_DIR = "spec-bench"  # under the bench's --out
# What every method of one export must share: its answers are compared question by question.
RUN_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k_sampling", "seed")


@dataclass(frozen=True)
class RunSettings:
    """What this bench run's methods were made with; every other method in --out must match it to be
    exported beside them (a mode's own dtype, `@float32`, is its choice; the others run at `dtype`)."""
    model: str
    config: dict  # RUN_FIELDS of the run's decode settings
    dataset: str  # mt_bench, or the dataset file's absolute path
    dtype: str  # the run's --dtype as resolved
    head_sha: str | None  # the draft head's weights (None: this run loads no head)
    user_turns: dict  # question_id -> the question's user turns in this run's dataset
    keys: frozenset  # (question_id, turn) of this run


def _mismatch(trace: Trace, want: RunSettings) -> tuple[str, object, object] | None:
    """The first run setting `trace` differs from this run in, as (field, its value, this run's)."""
    h, label = trace.header, str(trace.header.meta.get("mode_label", ""))
    fields = [("model", h.model, want.model), *((k, h.config.get(k), want.config.get(k)) for k in RUN_FIELDS)]
    if "dataset" in h.meta:
        fields.append(("dataset", h.meta["dataset"], want.dataset))
    if "@" not in label:
        fields.append(("dtype", h.config.get("dtype"), want.dtype))
    if h.meta.get("head_sha") is not None and want.head_sha is not None:
        fields.append(("head", h.meta["head_sha"], want.head_sha))
    messages = h.meta.get("messages") or [{"role": "user", "content": h.prompt}]
    turns = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    asked = want.user_turns.get(h.meta.get("question_id"))
    if asked is not None and turns != list(asked[:len(turns)]):
        fields.append(("dataset", "another question text", f"{want.dataset}'s"))
    return next(((k, old, new) for k, old, new in fields if old != new), None)


def check_same_run(bench_out: Path, own_labels: set[str], want: RunSettings) -> None:
    """Before a run that exports: every other method's trace file in --out must come from a run with this
    run's settings and answer every question this run asks, or the export would compare unlike runs.
    One sentence naming the file and the field otherwise, before anything is written."""
    for path in sorted((bench_out / "traces").glob("*.jsonl")):
        traces = [t for t in _finished(path) if t.header.meta.get("mode_label") not in own_labels]
        for trace in traces:
            diff = _mismatch(trace, want)
            if diff:
                field, old, new = diff
                raise ValueError(f"{path} was made with {field} {old!r} and this run with {new!r}: --export "
                                 "spec-bench compares every method in --out, so use a new --out or rerun its mode "
                                 "with these settings.")
        have = {(t.header.meta.get("question_id"), int(t.header.meta.get("turn", 0))) for t in traces}
        missing = sorted(want.keys - have, key=lambda k: (_question_order(k[0]), k[1]))
        if traces and missing:
            qid, turn = missing[0]
            raise ValueError(f"{path} has no answer to question {qid} turn {turn} of this run (its questions "
                             "differ: --limit, --per-category or --turns): --export spec-bench compares every "
                             "method in --out, so use a new --out or add its mode to --modes.")


def _finished(path: Path) -> list[Trace]:
    """A bench trace file's finished generations."""
    return [t for t in read_trace(path)[0] if "mode_label" in t.header.meta and t.steps and t.steps[-1].finished]


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts eval.py removes from a reply: every value of the tokenizer's special_tokens_map (lists
    flattened); none for a tokenizer without one."""
    texts: list[str] = []
    for value in getattr(tokenizer, "special_tokens_map", {}).values():
        texts.extend(value if isinstance(value, list) else [value])
    return tuple(t for t in texts if t)


def answer_text(text: str, specials: Iterable[str]) -> str:
    """A reply as eval.py stores it in `turns`: each special token's text removed, then stripped."""
    for special in specials:
        text = text.replace(special, "")
    return text.strip()


def _choice(turns: list[Trace], specials: tuple[str, ...]) -> dict:
    """One Spec-Bench choice from a question's turn traces, in turn order."""
    return {"index": 0,
            "turns": [answer_text("".join(s.new_text for s in t.steps), specials) for t in turns],
            "decoding_steps": [max(0, sum(s.target_forwards for s in t.steps) - 1) for t in turns],
            "new_tokens": [int(t.header.meta["new_tokens"]) for t in turns],
            "wall_time": [float(t.header.meta["seconds"]) for t in turns],
            "accept_lengths": [s.accept_length for t in turns for s in t.steps
                               if s.step > 0 and s.mode != "hf"]}


def _complete_turns(traces: list[Trace]) -> list[Trace] | None:
    """The turns 1..n of one question, or None when one is missing (an interrupted run)."""
    by_turn = {int(t.header.meta["turn"]): t for t in traces}
    turns = [by_turn.get(i) for i in range(1, max(by_turn) + 1)]
    return None if any(t is None for t in turns) else turns


def answer_records(traces: list[Trace], model_id: str, specials: tuple[str, ...] = (),
                   tstamp: float | None = None) -> list[dict]:
    """Spec-Bench answer lines for one method's traces (one line per question with all its turns, sorted by
    question_id as Spec-Bench's own eval leaves its files, so two methods' files align line by line);
    `specials`: the special token texts stripped from the replies (special_texts)."""
    per_question: dict[object, list[Trace]] = defaultdict(list)
    for t in traces:
        per_question[t.header.meta["question_id"]].append(t)
    records = []
    for qid, group in sorted(per_question.items(), key=lambda item: _question_order(item[0])):
        turns = _complete_turns(group)
        if turns is None:
            continue
        records.append({"question_id": qid, "category": turns[0].header.meta["category"],
                        "answer_id": f"{model_id}-{qid}", "model_id": model_id,
                        "choices": [_choice(turns, specials)], "tstamp": time.time() if tstamp is None else tstamp})
    return records


def _question_order(qid: object) -> tuple[int, int | str]:
    """Numeric ids in numeric order (MT-bench's 81..160), then any other ids as text."""
    return (0, int(qid)) if isinstance(qid, int) or str(qid).isdigit() else (1, str(qid))


def method_id(trace_file: Path, traces: list[Trace]) -> str:
    """Spec-Bench style `<model>-<method>-<dtype>` from a bench trace file (traces/<mode slug>.jsonl)."""
    meta = traces[0].header.meta
    dtype = str(meta.get("dtype", ""))
    method = trace_file.stem if dtype in trace_file.stem else f"{trace_file.stem}-{dtype}".rstrip("-")
    # the model's own name: a local directory's last part, a hub id's NAME (a slash would make the
    # answer file a path elsewhere, outside --out for an absolute directory)
    model = str(traces[0].header.model).rstrip("/").rsplit("/", 1)[-1]
    return f"{model}-{method}"


def export_spec_bench(bench_out: Path, tokenizer: Any, keys: frozenset | None = None) -> dict[str, Path]:
    """Write <bench_out>/spec-bench/<model_id>.jsonl for every mode's trace file, over the (question_id,
    turn) `keys` of the run (None: all; check_same_run has made sure each file answers them all);
    returns mode -> file."""
    written, specials = {}, special_texts(tokenizer)
    for trace_file in sorted((bench_out / "traces").glob("*.jsonl")):
        traces = [t for t in _finished(trace_file)
                  if keys is None or (t.header.meta.get("question_id"), int(t.header.meta["turn"])) in keys]
        if not traces:
            continue
        model_id = method_id(trace_file, traces)
        lines = [json.dumps(r, ensure_ascii=False) for r in answer_records(traces, model_id, specials)]
        path = bench_out / SPEC_BENCH_DIR / f"{model_id}.jsonl"
        atomic_write(path, "\n".join(lines) + "\n" if lines else "")
        written[traces[0].header.meta["mode_label"]] = path
    return written


# What speed.py reads is required; what answer_records adds beside it is checked where present.
ANSWER_KINDS, ANSWER_OPTIONAL = {"choices": "list"}, {"category": "str", "answer_id": "str", "model_id": "str",
                                                      "tstamp": "num"}
CHOICE_KINDS = {"turns": "list", "new_tokens": "list", "wall_time": "list"}
CHOICE_OPTIONAL = {"index": "nat", "decoding_steps": "ints", "accept_lengths": "ints"}


def read_answers(path: Path) -> list[dict]:
    """A Spec-Bench answer file, every line checked (check_answer): one sentence naming the line and field
    of the first malformed one. The file is an export to compare, so a bad line is refused, not skipped."""
    answers = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as err:  # also UnicodeDecodeError
                fail(path, f"line {lineno}", f"is not valid JSON ({err})")
            answers.append(check_answer(obj, path, f"line {lineno}"))
    return answers


def check_answer(obj: object, path: Path, what: str) -> dict:
    """One question's answer as answer_records writes it: one choice whose turns, new_tokens and wall_time
    have one entry per turn (tokens and seconds >= 0)."""
    check_object(obj, path, what, ANSWER_KINDS, ANSWER_OPTIONAL)
    qid = obj.get("question_id")
    if not (type(qid) is int or (isinstance(qid, str) and qid)):
        check_value(qid, path, f"{what} field 'question_id'", "int")
    if len(obj["choices"]) != 1:
        fail(path, f"{what} field 'choices'", f"holds {len(obj['choices'])} choices, not one")
    choice = check_object(obj["choices"][0], path, f"{what} choices[0]", CHOICE_KINDS, CHOICE_OPTIONAL)
    turns = len(choice["turns"])
    for field in ("turns", "new_tokens", "wall_time"):
        kind = {"turns": "str", "new_tokens": "nat", "wall_time": "nonneg"}[field]
        if len(choice[field]) != turns or not turns:
            fail(path, f"{what} choices[0] field {field!r}", f"has {len(choice[field])} entries for {turns} turn(s)")
        for i, value in enumerate(choice[field]):
            check_value(value, path, f"{what} choices[0] field {field!r} [{i}]", kind)
    return obj


def mean_speed(answers: list[dict]) -> float:
    """Spec-Bench's score of a method: the mean over questions of the question's tokens (new_tokens) over
    its wall time (eagle.records.stats.mean_rate)."""
    return mean_rate((sum(a["choices"][0]["new_tokens"]), sum(a["choices"][0]["wall_time"])) for a in answers)


def recounted_tokens(answer: dict, tokenizer: Any) -> int:
    """speed.py's token count of a baseline answer: len(tokenizer(turn).input_ids) - 1 over its turns."""
    return sum(len(tokenizer(turn).input_ids) - 1 for turn in answer["choices"][0]["turns"])


@dataclass(frozen=True)
class BaselineRecount:
    """The baseline as speed.py measures it, beside the tokens it generated."""
    mode: str
    generated: int  # sum of new_tokens over its answers
    recounted: int  # speed.py's recount of the same answers' text
    tokens_per_second: float  # speed.py's baseline speed: the per-question mean over recounted tokens


def recount_baseline(mode: str, answers: list[dict], tokenizer: Any) -> BaselineRecount:
    counts = [recounted_tokens(a, tokenizer) for a in answers]
    speed = mean_rate((n, sum(a["choices"][0]["wall_time"])) for n, a in zip(counts, answers))
    return BaselineRecount(mode, sum(sum(a["choices"][0]["new_tokens"]) for a in answers), sum(counts), speed)


def speedups(files: dict[str, Path], tokenizer: Any,
             baseline: str = "vanilla") -> tuple[dict[str, dict], BaselineRecount | None]:
    """Per mode: Spec-Bench's mean tokens/s and speed.py's speed-up over `baseline` (its tokens recounted
    with `tokenizer`; nan without a baseline), and the baseline's recount (None without one)."""
    answers = {mode: read_answers(path) for mode, path in files.items()}
    base = recount_baseline(baseline, answers[baseline], tokenizer) if baseline in answers else None
    base_speed = base.tokens_per_second if base else math.nan
    speeds = {mode: mean_speed(a) for mode, a in answers.items()}
    table = {mode: {"spec_bench_tokens_per_second": v, "spec_bench_speedup": speedup(v, base_speed)}
             for mode, v in speeds.items()}
    return table, base


def format_speedups(table: dict[str, dict], ours: dict[str, dict], base: BaselineRecount | None) -> str:
    """Spec-Bench's per-question means beside the bench's own totals, one line per mode, then what
    speed.py's speed-up divides by."""
    lines = [f"{'mode':<28} {'Spec-Bench tok/s':>16} {'Spec-Bench x':>12} {'bench tok/s':>11} {'bench x':>8}"]
    for mode, s in table.items():
        o = ours.get(mode, {})
        lines.append(f"{mode:<28} {s['spec_bench_tokens_per_second']:>16.2f} {s['spec_bench_speedup']:>12.3f} "
                     f"{o.get('tokens_per_second', math.nan):>11.2f} {o.get('speedup', math.nan):>8.3f}")
    if base is not None:
        lines += [f"Spec-Bench x is evaluation/speed.py's figure: over {base.mode} at {base.tokens_per_second:.2f} "
                  "tok/s, whose tokens it recounts from the answer text",
                  f"as len(tokenizer(turn).input_ids) - 1 per turn: {base.recounted} tokens for the {base.generated} "
                  "generated."]
    return "\n".join(lines)
