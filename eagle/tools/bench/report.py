"""A bench's summary: totals per mode and category (eagle.records.stats), speed-ups against the fastest
baseline of each kind, auto's predictions beside what was measured, greedy divergences from vanilla
with their logit gaps; written as summary.json, summary.md and steps.parquet, printed as tables, and
summary.json read back (the dashboard shows it)."""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

from ...core.config import TreeShape
from ...core.prompt import encode_prompt
from ...core.lossless import first_divergence, gap_and_top_at, is_precision_flip
from ...records.files import atomic_write, read_json_object
from ...records.markdown import markdown_table
from ...records.schema import check_object
from ...records.stats import mean, speedup, tau, tokens_per_second
from ...records.timing import STEP_PHASES, phase_seconds
from ..budget.choice import PLAIN, expected_accept_length, expected_round_s, expected_seconds
from ..budget.report import AutoReport
from .run import Bench, Plan, Result


# ---- summaries --------------------------------------------------------------------------------
def _rounds(results: list[Result]) -> list[int]:
    return [s.accept_length for r in results for s in r.steps if s.step > 0]


def mode_stats(results: list[Result], report: AutoReport | None = None) -> dict:
    """Totals over generations, by eagle.records.stats: tokens/s is total tokens over total wall time (not a
    mean of ratios); tau = new tokens / target forwards (prefill counted as one; HF generate: 1 per
    token, PLD fewer). With the auto `report` a tuned mode's budget came from, also what its cost
    model predicted for these same generations (prompt lengths and token counts, each with the tree
    auto chose for its prompt), and the measured parts it predicts: the accept length and the time of
    a drafted round."""
    tokens = sum(len(r.tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    forwards = sum(r.forwards for r in results)
    stats = {"generations": len(results), "tokens": tokens, "seconds": seconds,
             "tokens_per_second": tokens_per_second(tokens, seconds), "tau": tau(tokens, forwards),
             "mean_accept_length": mean(_rounds(results))}
    return {**stats, **_prediction(results, report)} if report and results else stats


def _tree(r: Result, report: AutoReport) -> TreeShape:
    """The tree a tuned mode's generation ran: under auto, the one chosen for its prompt (its header's
    config), or PLAIN where auto expected no tree to pay; the report's own for an adaptive mode (sized
    every round)."""
    c = r.config
    if c.get("mode") == "vanilla":
        return PLAIN
    if c.get("mode") == "dynamic" and "adaptive_costs" not in c and all(k in c for k in TreeShape.keys()):
        return TreeShape.of(c)
    return report.shape


def _prediction(results: list[Result], report: AutoReport) -> dict:
    """The prediction for each generation with its own tree; the two parts as means over the
    generations' trees, weighted by their predicted rounds (the round time at the reference context)."""
    steps = [s for r in results for s in r.steps if s.step > 0]
    trees = [_tree(r, report) for r in results]
    predicted_s = sum(expected_seconds(report, r.prompt_tokens, len(r.tokens), t) for r, t in zip(results, trees))
    # the same generations decoded plainly, by the same model: the speed-up it predicts does not depend on
    # how fast the machine runs this minute (a shared VM's speed drifts by ~10 % between minutes)
    plain_s = sum(expected_seconds(report, r.prompt_tokens, len(r.tokens), PLAIN) for r in results)
    drafted = [max(0, len(r.tokens) - 1) for r in results]
    rounds = [n / expected_accept_length(report, t) for n, t in zip(drafted, trees)]
    round_s = [expected_round_s(report, t) for t in trees]
    if sum(rounds) > 0:
        accept, round_s = sum(drafted) / sum(rounds), sum(n * s for n, s in zip(rounds, round_s)) / sum(rounds)
    else:  # no drafted round predicted (one-token generations): the reference tree's figures
        accept, round_s = report.expected_accept_length, round_s[0]
    return {"predicted_tokens_per_second": tokens_per_second(sum(len(r.tokens) for r in results), predicted_s),
            "predicted_accept_length": accept, "predicted_round_ms": 1000 * round_s,
            "predicted_speedup_same_dtype": plain_s / predicted_s if predicted_s > 0 else math.nan,
            "round_ms": 1000 * mean([sum(s.timings.values()) for s in steps])}


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
        same = _reference(by_mode, bench, "vanilla", dtype)
        s["speedup_same_dtype"] = ratio(s, same)
        s.setdefault("predicted_tokens_per_second", math.nan)
        # the model's speed-up over the vanilla measured beside it: its tokens/s at this run's machine speed
        s["predicted_tokens_per_second_at_run_speed"] = s.get("predicted_speedup_same_dtype", math.nan) * (
            by_mode[same]["tokens_per_second"] if same else math.nan)
    return by_mode


def predictions_line(by_mode: dict[str, dict]) -> str | None:
    """The auto budget's cost model against this run: predicted beside measured tokens/s per tuned mode,
    and the two parts it predicts (accept length per round, ms per drafted round at the reference
    context), so a miss says which part missed; then the speed-up it predicts over same-dtype vanilla
    against the one measured, and what that makes of tokens/s at the speed the machine ran this run."""
    rows = [f"{m}: predicted {s['predicted_tokens_per_second']:.2f} tok/s (accept {s['predicted_accept_length']:.2f}, "
            f"{s['predicted_round_ms']:.1f} ms/round), measured {s['tokens_per_second']:.2f} (accept "
            f"{s['mean_accept_length']:.2f}, {s['round_ms']:.1f} ms/round): "
            f"{_miss(s['tokens_per_second'], s['predicted_tokens_per_second'])}; speed-up over vanilla "
            f"{s['dtype']} predicted {s.get('predicted_speedup_same_dtype', math.nan):.3f}, measured "
            f"{s['speedup_same_dtype']:.3f}: at this run's machine speed {_fmt(s.get('predicted_tokens_per_second_at_run_speed'), '.2f')} "
            f"tok/s predicted, {_miss(s['tokens_per_second'], s.get('predicted_tokens_per_second_at_run_speed', math.nan))}"
            for m, s in by_mode.items() if not math.isnan(s.get("predicted_tokens_per_second", math.nan))
            and s.get("generations")]
    return "auto's cost model: " + "; ".join(rows) if rows else None


def _miss(measured: float, predicted: float | None) -> str:
    """How far the measurement is from the prediction, signed, or n/a."""
    if predicted is None or math.isnan(predicted) or predicted <= 0:
        return "n/a"
    return f"{100 * (measured / predicted - 1):+.1f} %"


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
        gap, top = gap_and_top_at(target, ids, ref, pos) if pos < len(ref) else (math.nan, math.nan)
        out.append({"mode": r.mode, "dtype": bench.dtype(spec), "question_id": r.question_id, "turn": r.turn,
                    "position": pos, "top2_logit_gap": gap, "top_logit": top,
                    "near_tie": is_precision_flip(target.dtype, gap, top) if not math.isnan(gap) else False})
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


def steps_table(results: list[Result]):
    """One row per step (an hf generation is one row), with the tree its generation ran (auto's: chosen
    per prompt); pandas only here, for the Parquet file."""
    import pandas as pd
    rows = []
    for r in results:
        cfg = r.config
        for s in r.steps:
            rows.append({"question_id": str(r.question_id), "category": r.category, "turn": r.turn,
                         "mode": r.mode, "kind": s.mode, "step": s.step, "accept_length": s.accept_length,
                         "new_tokens": len(s.new_tokens), "target_forwards": s.target_forwards,
                         "drafted": max(0, len(s.nodes) - 1), "verified": sum(n.kept for n in s.nodes[1:]),
                         **{f"t_{k}": phase_seconds(s.timings, k) for k in (*STEP_PHASES, "generate")},
                         "finished": s.finished, **{k: cfg.get(k) for k in (*TreeShape.keys(), "temperature")}})
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


def write_outputs(plan: Plan, results: list[Result], summary: dict) -> None:
    plan.out.mkdir(parents=True, exist_ok=True)
    table = steps_table(results)
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
    predicted = ("predicted_accept_length", "predicted_round_ms", "round_ms", "predicted_speedup_same_dtype",
                 "predicted_tokens_per_second_at_run_speed")  # tuned modes only
    modes = {m: {**{k: s[k] for k in keys}, **{k: s[k] for k in predicted if k in s}, "mismatches": mism.get(m) if summary["mismatches"] is not None else None}
             for m, s in summary["modes"].items()}
    extra = {k: summary.get(k) for k in ("questions", "generations", "turns", "greedy", "mismatches", "divergences",
                                         "skipped_records", "resumed", "out", "head", "threads", "budget", "dtype", "baselines")}
    return json.dumps(_clean({"modes": modes, **extra}))


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

