"""Spec-Bench answer files from an `eagle bench` run, and Spec-Bench's speed-up.

Spec-Bench (hemingkx/Spec-Bench) keeps one JSONL answer file per method; each line is one question:
question_id, category, answer_id, model_id, tstamp and choices = [{index, turns (the reply text per turn),
decoding_steps, new_tokens and wall_time (one entry per turn), accept_lengths (one per decoding round, all
turns together)}]. Its evaluation/speed.py scores a method by the mean over questions of
sum(new_tokens) / sum(wall_time), and the speed-up as that mean over the baseline's same mean; the bench
table's tok/s (all tokens over all seconds) weights long answers more, so the two differ.

Mapping from our traces: decoding_steps = target forwards after the prefill; accept_lengths = our
accept_length per round (accepted drafts + the bonus token), empty for HF generate (no rounds to count);
wall_time = the bench's wall seconds of the turn's generation. Spec-Bench recounts the baseline's tokens by
re-tokenising its text; we use the recorded new_tokens for both.
"""
from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path

from ..stats import mean_rate, speedup
from ..files import atomic_write
from ..trace import Trace, read_trace

SPEC_BENCH_DIR = "spec-bench"  # under the bench's --out


def _choice(turns: list[Trace]) -> dict:
    """One Spec-Bench choice from a question's turn traces, in turn order."""
    return {"index": 0,
            "turns": ["".join(s.new_text for s in t.steps) for t in turns],
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


def answer_records(traces: list[Trace], model_id: str, tstamp: float | None = None) -> list[dict]:
    """Spec-Bench answer lines for one method's traces (one line per question with all its turns)."""
    per_question: dict[object, list[Trace]] = defaultdict(list)
    for t in traces:
        per_question[t.header.meta["question_id"]].append(t)
    records = []
    for qid, group in per_question.items():
        turns = _complete_turns(group)
        if turns is None:
            continue
        records.append({"question_id": qid, "category": turns[0].header.meta["category"],
                        "answer_id": f"{model_id}-{qid}", "model_id": model_id,
                        "choices": [_choice(turns)], "tstamp": time.time() if tstamp is None else tstamp})
    return records


def method_id(trace_file: Path, traces: list[Trace]) -> str:
    """Spec-Bench style `<model>-<method>-<dtype>` from a bench trace file (traces/<mode slug>.jsonl)."""
    meta = traces[0].header.meta
    dtype = str(meta.get("dtype", ""))
    method = trace_file.stem if dtype in trace_file.stem else f"{trace_file.stem}-{dtype}".rstrip("-")
    return f"{traces[0].header.model}-{method}"


def export_spec_bench(bench_out: Path) -> dict[str, Path]:
    """Write <bench_out>/spec-bench/<model_id>.jsonl for every mode's trace file; returns mode -> file."""
    written = {}
    for trace_file in sorted((bench_out / "traces").glob("*.jsonl")):
        traces = [t for t in read_trace(trace_file)[0] if "mode_label" in t.header.meta and t.steps
                  and t.steps[-1].finished]
        if not traces:
            continue
        model_id = method_id(trace_file, traces)
        lines = [json.dumps(r, ensure_ascii=False) for r in answer_records(traces, model_id)]
        path = bench_out / SPEC_BENCH_DIR / f"{model_id}.jsonl"
        atomic_write(path, "\n".join(lines) + "\n" if lines else "")
        written[traces[0].header.meta["mode_label"]] = path
    return written


def read_answers(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mean_speed(answers: list[dict]) -> float:
    """Spec-Bench's score: the mean over questions of the question's tokens over its wall time
    (eagle.stats.mean_rate)."""
    return mean_rate((sum(a["choices"][0]["new_tokens"]), sum(a["choices"][0]["wall_time"]))
                           for a in answers)


def speedups(files: dict[str, Path], baseline: str = "vanilla") -> dict[str, dict]:
    """Per mode: Spec-Bench's mean tokens/s and its speed-up over `baseline` (nan without one)."""
    speeds = {mode: mean_speed(read_answers(path)) for mode, path in files.items()}
    base = speeds.get(baseline, math.nan)
    return {mode: {"spec_bench_tokens_per_second": s, "spec_bench_speedup": speedup(s, base)}
            for mode, s in speeds.items()}


def format_speedups(table: dict[str, dict], ours: dict[str, dict]) -> str:
    """Spec-Bench's per-question means beside the bench's own totals, one line per mode."""
    lines = [f"{'mode':<28} {'Spec-Bench tok/s':>16} {'Spec-Bench x':>12} {'bench tok/s':>11} {'bench x':>8}"]
    for mode, s in table.items():
        o = ours.get(mode, {})
        lines.append(f"{mode:<28} {s['spec_bench_tokens_per_second']:>16.2f} {s['spec_bench_speedup']:>12.3f} "
                     f"{o.get('tokens_per_second', math.nan):>11.2f} {o.get('speedup', math.nan):>8.3f}")
    return "\n".join(lines)
