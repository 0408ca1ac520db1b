"""`python -m eagle bench`'s command line: its flags, the checks that need no model, the pairs and each
mode's tree (fixed, auto or adaptive, as generate would choose it), the run under the --out lock with
runs/bench/LATEST pointing at it, and the exit code (1 when greedy outputs differ beyond a near-tie)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from ...core.config import MODES
from ...models.headio import head_sha256
from ...models.precision import dtype_name, runnable_dtypes
from ...records.files import exclusive_lock, run_guarded
from ...records.questions import DATASETS, load_questions, select_questions
from ...records.schema import FileFormatError
from ..budget.report import AutoReport
from ..session import Choice, Session
from ..checks import ArgumentParser, check_argv, check_output, check_runtime_args
from ..loading import KNOBS_EPILOG, DecodeSettings, ModelSpec, add_decode_args, budget_mode, check_local_paths, \
    config_from_args, flag_name, load_pair, model_spec
from .report import json_line, print_report, read_summary, summarize, write_outputs
from .run import Bench, Key, Pair, Plan, Result, run_plan
from .spec import ModeSpec, parse_modes, with_baselines
from .specbench import RUN_FIELDS, RunSettings, check_same_run, export_spec_bench, format_speedups, speedups
from .store import Expected, load_store

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
                  default_dtype: str) -> tuple[dict, dict[str, str], AutoReport | None, dict[str, AutoReport]]:
    """One DecodeConfig per mode label before the budget policy (hf modes keep the sampling fields),
    each tuned mode's budget, the auto-budget report (or None), and per tuned mode the auto report its
    trees come from, read (or made) here once per run at the mode's dtype. dynamic:auto, and a plain
    dynamic wherever generate would use auto (see _tuned), take the auto budget: each prompt then gets
    the tree auto chooses for its context, as generate gives it (Session.prepare); dynamic:adaptive
    auto's shape with a per-round size. The summary sets what a report predicts beside what the mode measured."""
    configs, budgets, report, predicted = {}, {}, None, {}
    for spec in specs:
        pair = bench_pairs[spec.dtype or default_dtype]
        cfg = config_from_args(args, spec.kind if spec.kind in MODES else "vanilla").with_(**dict(spec.overrides))
        configs[spec.label] = cfg
        if _tuned(args, spec, pair.target.device.type):
            budgets[spec.label] = spec.budget if spec.budget != "fixed" else "auto"
            # no header here, so no head hash: the reference choice and the report every prompt tunes from
            reference = Session(pair.target, pair.head, pair.source).choose(cfg, budgets[spec.label], None)
            report = predicted[spec.label] = reference.report
            cfg = reference.config
            print(_tuned_line(spec.label, budgets[spec.label], reference), file=sys.stderr)
        elif spec.kind in ("static", "dynamic"):
            print(f"{spec.label}: fixed tree {cfg.shape.label()} (total/depth/top_k/draft vocab)", file=sys.stderr)
        head = pair.head
        no_counts = head is not None and cfg.draft_vocab and head.draft_vocab_ids(cfg.draft_vocab) is None
        if spec.kind in ("static", "dynamic") and no_counts:
            print(f"note: {spec.label}: the head has no token counts, so draft_vocab {cfg.draft_vocab} "
                  "falls back to the full vocabulary", file=sys.stderr)
    return configs, budgets, report, predicted


def _tuned_line(label: str, budget: str, reference: Choice) -> str:
    """The start-of-run line of a tuned mode: its trees are chosen per prompt (auto) or per round
    (adaptive); the reference is auto's own choice, at its probe's prefix length."""
    report, cfg = reference.report, reference.config
    if budget == "adaptive":
        shape = f"auto's shape {cfg.depth}/{cfg.top_k}/{cfg.draft_vocab} (depth/top_k/draft vocab), each round's " \
                f"size chosen up to {cfg.total_tokens}"
    else:
        shape = f"the tree per prompt by context (prompt + max_new_tokens / 2); auto's reference " \
                f"{report.shape.label()} (total/depth/top_k/draft vocab)"
    note = f"; at the reference: {reference.note}" if reference.note else ""
    return f"{label}: {shape}, auto expects {report.expected_speedup:.2f}x {report.vanilla_label}{note}"


def _tuned(args: argparse.Namespace, spec: ModeSpec, device_type: str) -> bool:
    """Whether a mode's tree comes from the auto budget: dynamic:auto|adaptive, and a plain `dynamic`
    wherever `generate --mode dynamic` would use auto with the same flags (a CPU, no --preset, no tree
    flag, no --budget fixed), so the two commands decode the same tree."""
    if spec.budget != "fixed":
        return True
    return spec.kind == "dynamic" and not spec.overrides and budget_mode(args, "dynamic", device_type) == "auto"


def load_pairs(args: argparse.Namespace, specs: list[ModeSpec],
               loaded: dict[str, Pair] | None = None) -> tuple[dict[str, Pair], str]:
    """The run's pair at --dtype, plus one per other dtype a mode asks for (same model and head, at that
    dtype's faster kernel as auto would run it: a baseline in another precision is its fastest);
    pairs already `loaded` are kept (the first of them is the run's)."""
    need_head = any(s.kind in ("static", "dynamic") for s in specs)
    if loaded:  # the other dtypes load the head the first pair found (no second hub lookup)
        default, pairs = next(iter(loaded)), dict(loaded)
        spec = ModelSpec(str(args.model), pairs[default].source if need_head else None, args.device, default,
                         str(args.head_dtype))
    else:
        spec = model_spec(DecodeSettings.from_args(args), need_head)
        target, head, source = load_pair(spec)
        default = dtype_name(target.dtype)
        pairs = {default: Pair(target, head, source, head_sha256(head) if head is not None else None)}
    for dtype in sorted({s.dtype for s in specs if s.dtype and s.dtype not in pairs}):
        other, other_head, other_source = load_pair(replace(spec, dtype=dtype, fastest_kernel=True))
        pairs[dtype] = Pair(other, other_head, other_source,
                            head_sha256(other_head) if other_head is not None else None)
    return pairs, default


def _check_budget_flag(budget: str | None, specs: list[ModeSpec]) -> None:
    """bench applies --budget auto to its dynamic modes; anything else it would silently ignore."""
    if budget == "adaptive":
        raise ValueError("bench --budget adaptive: name the mode dynamic:adaptive in --modes instead")
    if budget == "auto" and not any(s.kind == "dynamic" for s in specs):
        raise ValueError("--budget auto sizes dynamic trees, but --modes has no dynamic mode")


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
    configs, budgets, budget_report, predicted = build_configs(args, plan.specs, pairs, default_dtype)
    bench = Bench(pairs, default_dtype, configs, plan.specs, budgets, predicted)
    by_id = {q.question_id: q for q in plan.questions}
    if args.export == "spec-bench":  # before anything is written: the export must not mix unlike runs
        check_same_run(plan.out, {s.label for s in plan.specs}, _run_settings(bench, plan, default_dtype))
    done: dict[Key, Result] = {}
    for spec in plan.specs:
        want = Expected(spec.label, partial(bench.config_dict, spec), bench.pair(spec).target.name,
                        bench.head_sha(spec), by_id)
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
                   "dataset": str(args.dataset), "dtype": default_dtype,
                   "budget": budget_report.to_json() if budget_report else None,
                   "configs": {s.label: _reference_config(bench, s) for s in plan.specs}}
        write_outputs(plan, results, summary)
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


def _reference_config(bench: Bench, spec: ModeSpec) -> dict:
    """summary.json's config of a mode: a tuned mode's (its "budget" named) at auto's reference context,
    its trees per prompt being in each trace header and in steps.parquet."""
    budget = bench.budget(spec)
    return {**bench.config_dict(spec, None), **({"budget": budget} if budget != "fixed" else {})}


def _run_settings(bench: Bench, plan: Plan, default_dtype: str) -> RunSettings:
    """What the Spec-Bench export requires every method in --out to share with this run."""
    config = bench.config_dict(plan.specs[0], None)
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
