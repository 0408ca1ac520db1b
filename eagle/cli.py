"""Command line: `python -m eagle generate|bench|prepare|train|app ...` (installed: `eagle2-explorer ...`).
argparse lives only here.

Every command runs inside `eagle.records.files.run_guarded`: a bad input is one sentence and exit code 2.
The checks that need no model (flags, paths, argv and stdin encoding) run before one loads."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from .tools.checks import ArgumentParser, check_argv, check_output, check_ranges, check_runtime_args
from .core.config import MODES, DecodeConfig, TreeShape
from .core.decode import generate
from .core.prompt import PromptError, encode_prompt
from .records.files import atomic_write_json, run_guarded
from .tools.loading import KNOBS_EPILOG, DecodeSettings, add_decode_args, add_model_args, budget_mode, flag_name, \
    load_pair, model_spec
from .records.questions import load_questions
from .models.location import DEFAULT_MODEL
from .models.kernels import head_precision
from .models.precision import device_name, dtype_name
from .tools.bench.command import main as bench_main
from .models.layouts import CONVENTIONS, FORMATS, LABELS
from .tools.budget.report import AutoReport
from .tools.headexport import export_head
from .tools.session import Session
from .tools.profile import format_profiles, model_label, profile_rounds, tiny_llama
from .tools.tokenmap import export_token_map
from .records.trace import Trace, append_trace, mark_interrupted
from .training.commands import main as training_main

DELEGATED = ("bench", "prepare", "train", "evaluate", "distill", "ablation")
# The dashboard script, beside this package both in a checkout and in site-packages (the wheel installs
# eagle and app side by side); located by path because eagle never imports the app layer.
DASHBOARD = Path(__file__).resolve().parent.parent / "app" / "main.py"


def read_prompt(prompt: str) -> str:
    """--prompt, or stdin for '-', as text (stdin read as bytes, so bad UTF-8 is one sentence)."""
    if prompt != "-":
        return prompt
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start:err.start + 1]
        raise ValueError(f"the prompt on stdin is not valid UTF-8 (byte {err.start}: {bad!r})") from None


def check_generate_args(args: argparse.Namespace) -> tuple[DecodeSettings, DecodeConfig]:
    """The flags as typed settings, checked by the validate() the notebook's keywords go through too."""
    settings = DecodeSettings.from_args(args)
    cfg = settings.validate(flag_name)
    if getattr(args, "prompt", "-") != "-" and not args.prompt.strip():  # blank whatever the model: say so now
        raise PromptError("The prompt is empty: type something to generate from.")
    check_runtime_args(args)  # sets the thread count
    if args.trace:
        check_output(args.trace, "--trace", directory=False)
    return settings, cfg


def cmd_generate(args: argparse.Namespace) -> int:
    settings, cfg = check_generate_args(args)
    prompt = read_prompt(args.prompt)
    target, head, source = load_pair(model_spec(settings, cfg.mode != "vanilla"))
    budget = budget_mode(settings, cfg.mode, target.device.type)
    run = Session.of(target, head, source).prepare(prompt, cfg, budget)
    if run.budget_report is not None:
        print(_budget_line(budget, run.budget_report), file=sys.stderr)
    if run.note:
        print(f"note: {run.note}", file=sys.stderr)
    cfg, header = run.config, run.header
    steps = []

    def on_step(record) -> bool:
        steps.append(record)
        if not args.json:
            print(record.new_text, end="", flush=True)
        return False

    try:
        result = generate(run.decoder, run.ids, on_step)
    except BaseException:  # Ctrl-C, a closed pipe, a failure: keep what was generated, marked as such
        if args.trace and steps:
            append_trace(args.trace, mark_interrupted(Trace(header, steps)))
        raise
    if args.trace:  # the whole generation in one locked append: concurrent runs never interleave
        header.meta["seconds"] = result.seconds  # the wall time, for the rates (eagle.records.stats)
        append_trace(args.trace, Trace(header, steps))
    _print_result(args, target, cfg, result, source, header.meta.get("head_dtype"))
    return 0


def _print_result(args: argparse.Namespace, target, cfg: DecodeConfig, result, source: str | None,
                  head_drafts_in: str | None) -> None:
    text = target.tokenizer.decode(result.tokens, skip_special_tokens=True)
    summary = {"text": text, "new_tokens": len(result.tokens), "seconds": round(result.seconds, 4),
               "tokens_per_second": round(result.tokens_per_second, 3), "mode": cfg.mode,
               "tau": round(result.tau, 4), "target_forwards": result.target_forwards,
               "finished": result.finished, "head": source, "dtype": dtype_name(target.dtype),
               "head_dtype": head_drafts_in, "config": asdict(cfg)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"\n[{cfg.mode}, {dtype_name(target.dtype)}] {len(result.tokens)} tokens in {result.seconds:.2f} s "
              f"({result.tokens_per_second:.1f} tok/s), tau {result.tau:.2f}, stop: {result.finished}",
              file=sys.stderr)


def _budget_line(budget: str, report: AutoReport) -> str:
    chosen = report.context_choice or {**report.chosen, "speedup": report.expected_speedup}
    where = f" for a {report.context}-token context" if report.context is not None else ""
    shape = TreeShape.of(chosen).as_dict()
    return (f"budget {budget}: {shape}{where} (auto expects {chosen['speedup']:.2f}x {report.vanilla_label}; "
            "--budget fixed for the flags' values)")


def cmd_budget(args: argparse.Namespace) -> int:
    """Choose (or show the cached choice of) the auto tree budget for this machine."""
    check_runtime_args(args)
    spec = replace(model_spec(DecodeSettings.from_args(args), need_head=True), remeasure=args.refresh)
    target, head, source = load_pair(spec)
    report = Session(target, head, source).auto_report(refresh=args.refresh)
    if args.json:
        print(json.dumps({**report.to_json(), "dtype": dtype_name(target.dtype), "dtype_report": target.dtype_report,
                          "head_dtype": head_precision(head)}))
        return 0
    why = target.dtype_report["reason"] if target.dtype_report else f"--dtype {args.dtype}"
    print(f"dtype: {dtype_name(target.dtype)} ({why}); the head drafts in {head_precision(head)}")
    print(f"chosen: {report.chosen}  expected tau {report.expected_accept_length:.2f}, "
          f"{report.expected_speedup:.2f}x {report.vanilla_label} ({report.vanilla_tokens_per_s:.1f} tok/s; "
          f"{report.expected_speedup_same_dtype:.2f}x vanilla {dtype_name(target.dtype)})")
    print("tree size  expected tau  round ms  expected tok/s")
    for r in report.curve:
        print(f"{r['total_tokens']:9d}  {r['accept_length']:12.2f}  {1000 * r['round_s']:8.1f}  "
              f"{r['tokens_per_s']:14.1f}")
    for row in report.by_context:
        print(f"at a {row['context']:4d}-token context: {TreeShape.of(row).label()} (total/depth/top_k/vocab), "
              f"expected {row['speedup']:.2f}x {report.vanilla_label}")
    print(f"report: {report.auto_file}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Each phase of a round, on the model and on a tiny random Llama: where the overhead goes."""
    settings, cfg = check_generate_args(args)  # --prompts too (eagle.tools.checks.FLAG_RANGES)
    if args.preset == "vanilla" or (args.total_tokens is not None and args.total_tokens < 2):
        flag = "--preset vanilla" if args.preset == "vanilla" else f"--total-tokens {args.total_tokens}"
        raise ValueError(f"{flag}: profile times the phases of a draft tree's round and this verifies one token "
                         "with no tree; time plain decoding with `bench --modes vanilla`.")
    if args.json and args.json.exists() and not args.force:
        raise ValueError(f"--json {args.json} exists: give a new file name, or --force to replace it.")
    target, head, source = load_pair(model_spec(settings, need_head=True))
    questions, _ = load_questions("mt_bench")
    prompts = [encode_prompt(target.tokenizer, q.turns[0], target.max_context) for q in questions[:args.prompts]]
    budget = budget_mode(settings, cfg.mode, target.device.type)
    cfg, costs, report = Session(target, head, source).tune(cfg, budget)  # no header: no head hash needed
    if report is not None:
        print(_budget_line(budget, report), file=sys.stderr)
    profiles = [profile_rounds(target, head, cfg, prompts, model_label(target), costs)]
    if not args.no_tiny:
        tiny, tiny_head = tiny_llama(target)
        profiles.append(profile_rounds(tiny, tiny_head, cfg, prompts, model_label(tiny)))
    print(f"{cfg.mode} {cfg.shape.label()} (total/depth/top_k/vocab{', adaptive' if costs else ''}), head {source}, "
          f"{len(prompts)} MT-bench prompts x {cfg.max_new_tokens} tokens, {torch.get_num_threads()} threads, "
          f"{device_name(target.device)}")
    print(format_profiles(profiles))
    if args.json:
        atomic_write_json(args.json, {"config": asdict(cfg), "head": source, "device": device_name(target.device),
                                      "threads": torch.get_num_threads(),
                                      "profiles": [p.to_json() for p in profiles]}, indent=1)
    return 0


def cmd_export_token_map(args: argparse.Namespace) -> int:
    check_ranges(args)
    check_output(args.out, "--out", directory=False)
    ids = export_token_map(args.out, args.head, args.k, args.model, args.force)
    print(f"wrote {ids.numel()} token ids to {args.out} (SGLang: --speculative-token-map {args.out})")
    return 0


def cmd_export_head(args: argparse.Namespace) -> int:
    layout = export_head(args.head, args.format, args.out, args.overwrite, args.verifier, args.model)
    ids = "" if layout.layer_ids is None else f", layer ids {list(layout.layer_ids)}"
    print(f"read {args.head} as {LABELS[layout.name]} ({CONVENTIONS[layout.convention]}{ids}); "
          f"wrote {LABELS[args.format]} to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m eagle", description="EAGLE-2 Explorer decoder")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt", epilog=KNOBS_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--prompt", required=True, help="the user message ('-' reads stdin)")
    g.add_argument("--mode", choices=MODES, default="dynamic")
    g.add_argument("--trace", type=Path, default=None, help="append the trace (JSON lines) to this file")
    g.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    add_decode_args(g)
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("budget", help="choose the tree budget for this machine (cached) and show why")
    add_model_args(b)
    b.add_argument("--refresh", action="store_true", help="measure this machine again instead of reading the cache: "
                   "the precisions, kernels and the tree budget")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_budget)
    f = sub.add_parser("profile", help="time each phase of a decoding round, on the model and a tiny random Llama",
                       epilog=KNOBS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--mode", choices=("static", "dynamic"), default="dynamic", help="the tree to profile")
    f.add_argument("--prompts", type=int, default=3, help="MT-bench first turns to decode (3)")
    f.add_argument("--no-tiny", action="store_true", help="skip the tiny random Llama (2 layers, hidden 64)")
    f.add_argument("--json", type=Path, default=None, help="also write the profiles to this JSON file")
    f.add_argument("--force", action="store_true", help="replace --json if it exists")
    add_decode_args(f)
    f.set_defaults(func=cmd_profile, trace=None)
    t = sub.add_parser("export-token-map", help="write the draft vocabulary as SGLang's --speculative-token-map file")
    t.add_argument("--k", type=int, required=True, help="how many of the most frequent tokens (e.g. 32768)")
    t.add_argument("--out", type=Path, required=True, help="the .pt file to write")
    t.add_argument("--head", default="auto", help="head directory, or auto: the shipped head for --model")
    t.add_argument("--model", default=DEFAULT_MODEL, help="the target the shipped head belongs to")
    t.add_argument("--force", action="store_true", help="replace --out if it exists")
    t.set_defaults(func=cmd_export_token_map)
    e = sub.add_parser("export-head",
                       help="write a head in the layout SGLang (eagle3, eagle) or vLLM (speculators) loads")
    e.add_argument("--head", required=True, help="head directory in any layout this decoder reads, or auto: the "
                   "shipped head for --model")
    e.add_argument("--format", choices=FORMATS, required=True,
                   help="eagle3: SpecForge's EAGLE-3 (SGLang); speculators: vLLM; eagle: official EAGLE-1/2")
    e.add_argument("--out", type=Path, required=True, help="the directory to write (new or empty)")
    e.add_argument("--overwrite", action="store_true", help="replace a head already in --out")
    e.add_argument("--verifier", default=None, help="speculators: the target's name or path to record")
    e.add_argument("--model", default=DEFAULT_MODEL, help="the target whose shipped head --head auto means")
    e.set_defaults(func=cmd_export_head)
    for name in DELEGATED:
        sub.add_parser(name, add_help=False, help=f"see `python -m eagle {name} --help`")
    sub.add_parser("app", add_help=False, help="start the dashboard (`streamlit run` on the installed "
                   "app/main.py); further flags go to streamlit, e.g. --server.port 8502")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every command; bench, prepare, train and distill are handed to their modules' mains, which
    run inside the same error boundary, and app to streamlit."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "app":  # every further flag is streamlit's
        return run_guarded(lambda: start_dashboard(argv[1:]))
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    return run_guarded(lambda: _run(argv))


def _run(argv: list[str]) -> int:
    check_argv(argv)
    args = build_parser().parse_args(argv)
    return args.func(args)


def _delegate(command: str, argv: list[str]) -> int:
    if command == "bench":
        return bench_main(argv)
    return training_main([command, *argv])


def start_dashboard(argv: list[str]) -> int:
    """Replace this process with `streamlit run` on the dashboard, so Ctrl-C and a terminate signal reach
    the server itself. streamlit runs as a module of this interpreter: eagle never imports it."""
    if not DASHBOARD.is_file():
        raise ValueError(f"the dashboard script {DASHBOARD} is missing: reinstall eagle2-explorer")
    cmd = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD), *argv]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)
    return 0  # not reached: execv returns only by raising OSError
