"""Command line: `python -m eagle generate|bench|prepare|train ...`. argparse lives only here.

Every command runs inside `eagle.files.run_guarded`: a bad input is one sentence and exit code 2.
The checks that need no model (flags, paths, argv and stdin encoding) run before one loads."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .checks import check_argv, check_output, check_runtime_args, check_seed
from .config import MODES, PRESETS, DecodeConfig
from .files import run_guarded
from .head import locate_head, resolve_head
from .target import DEFAULT_MODEL, DTYPE_CHOICES, dtype_name, load_target
from .trace import Trace, TraceHeader, append_trace, mark_interrupted

DELEGATED = ("bench", "prepare", "train", "distill")


KNOBS_EPILOG = """knob names elsewhere (official EAGLE / SGLang / vLLM):
  --total-tokens  total_token / --speculative-num-draft-tokens / (tree verified nodes, root included)
  --depth         depth / --speculative-num-steps = depth + 1 (SGLang counts levels) / num_speculative_tokens
                  = depth + 1 for a chain (top_k 1)
  --top-k         top_k / --speculative-eagle-topk / -
  --draft-vocab   FR-Spec's reduced draft vocabulary / --speculative-token-map (see export-token-map) / -
presets: paper = 60/6/10 (the EAGLE-2 paper; the official scripts default to depth 5); cpu = a fixed small tree"""


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Which target and head, where and at what precision: shared by generate, bench and budget."""
    p.add_argument("--model", default=DEFAULT_MODEL, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--head", default="auto", help="draft head: a directory, a Hugging Face id (e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B), "
                        "'auto' (the shipped head for --model, else random) or 'random'")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="precision of the target and head; auto (default): bf16 on CUDA (fp16 without bf16), "
                        "on a CPU the faster of fp32 and bf16 as measured once on this machine")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's); 1 is steadier on a shared machine")


def add_decode_args(p: argparse.ArgumentParser) -> None:
    """Model, head and decoding options shared by `generate` and `bench`."""
    d = DecodeConfig()
    add_model_args(p)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="tree budget preset (paper: 60/6/10, the EAGLE-2 paper's; cpu: a fixed 4/1/4 tree with a "
                        "4096-token draft vocabulary; for one measured on this machine use --budget auto)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=f"default {d.max_new_tokens}")
    p.add_argument("--temperature", type=float, default=d.temperature, help=f"0 = greedy (default {d.temperature})")
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"default {d.top_p}")
    p.add_argument("--top-k-sampling", type=int, default=d.top_k_sampling, help=f"target top-k (0 = off; default {d.top_k_sampling})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"default {d.seed}")
    p.add_argument("--total-tokens", type=int, default=None, help=f"nodes verified per round, root included (default: on a CPU the auto budget chooses it, on CUDA {d.total_tokens})")
    p.add_argument("--depth", type=int, default=None, help=f"draft expansion steps; 0: only the root's children (default: on a CPU the auto budget chooses it, on CUDA {d.depth})")
    p.add_argument("--top-k", type=int, default=None, help=f"children per node and beam width (default: on a CPU the auto budget chooses it, on CUDA {d.top_k})")
    p.add_argument("--draft-vocab", type=int, default=None, help="FR-Spec: score only the K most frequent tokens; 0 = all (default: on a CPU the auto budget "
                        f"chooses it, on CUDA {d.draft_vocab})")
    p.add_argument("--budget", choices=("fixed", "auto", "adaptive"), default=None,
                   help="auto: pick total_tokens/depth/top_k/draft_vocab from this machine's measured costs "
                        "(default on CPU unless --preset or a tree flag is given; fixed on CUDA); adaptive: "
                        "auto's draft shape, with each round's tree size chosen from its path values")


def config_from_args(args: argparse.Namespace, mode: str) -> DecodeConfig:
    base = PRESETS[args.preset] if args.preset else DecodeConfig()
    overrides = {k: getattr(args, k) for k in ("total_tokens", "depth", "top_k", "draft_vocab")
                 if getattr(args, k) is not None}
    return base.with_(mode=mode, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_p=args.top_p, top_k_sampling=args.top_k_sampling, seed=check_seed(args.seed), **overrides)


def budget_mode(args: argparse.Namespace, device_type: str) -> str:
    """--budget as given; otherwise auto on a CPU (the GPU-tuned defaults lose to vanilla there)
    unless the user chose the tree with --preset or an explicit size flag."""
    if args.budget:
        return args.budget
    explicit = args.preset or any(getattr(args, k) is not None for k in ("total_tokens", "depth", "top_k",
                                                                         "draft_vocab"))
    return "auto" if device_type == "cpu" and not explicit else "fixed"


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


def load_pair(args: argparse.Namespace, need_head: bool):
    """The target at --dtype (saying on stderr how auto chose it) and, when needed, the head."""
    if need_head:  # a hub id downloads (or fails offline) before the target takes time to load
        args.head = locate_head(args.head)
    target = load_target(args.model, device=args.device, dtype=args.dtype)
    if target.dtype_report:
        print(f"dtype auto: {target.dtype_report['reason']}", file=sys.stderr)
    head, source = resolve_head(target, args.head) if need_head else (None, None)
    return target, head, source


def check_generate_args(args: argparse.Namespace) -> DecodeConfig:
    cfg = config_from_args(args, args.mode)
    if args.budget in ("auto", "adaptive") and cfg.mode != "dynamic":
        raise ValueError(f"--budget {args.budget} sizes dynamic trees only, but --mode is {cfg.mode}: drop "
                         "--budget or use --mode dynamic")
    check_runtime_args(args)
    if args.trace:
        check_output(args.trace, "--trace", directory=False)
    return cfg


def cmd_generate(args: argparse.Namespace) -> int:
    from .decode import Decoder, encode_prompt, generate
    cfg = check_generate_args(args)
    prompt = read_prompt(args.prompt)
    target, head, source = load_pair(args, cfg.mode != "vanilla")
    ids = encode_prompt(target.tokenizer, prompt, target.max_context)  # bad prompts fail before tuning
    costs = None
    budget = budget_mode(args, target.device.type)
    if cfg.mode == "dynamic" and budget != "fixed":
        from .budget import tuned_config
        # the generation's mean context: the prompt plus half the reply it may write
        cfg, costs, report = tuned_config(target, head, cfg, budget, context=len(ids) + cfg.max_new_tokens // 2)
        print(_budget_line(budget, report), file=sys.stderr)
    header = TraceHeader(target.name, source, asdict(cfg), prompt, len(ids),
                         {"dtype": dtype_name(target.dtype), "device": target.device.type})
    steps = []

    def on_step(record) -> bool:
        steps.append(record)
        if not args.json:
            print(record.new_text, end="", flush=True)
        return False

    try:
        result = generate(Decoder(target, head, cfg, costs), ids, on_step)
    except BaseException:  # Ctrl-C, a closed pipe, a failure: keep what was generated, marked as such
        if args.trace and steps:
            append_trace(args.trace, mark_interrupted(Trace(header, steps)))
        raise
    if args.trace:  # the whole generation in one locked append: concurrent runs never interleave
        append_trace(args.trace, Trace(header, steps))
    _print_result(args, target, cfg, result, source)
    return 0


def _print_result(args: argparse.Namespace, target, cfg: DecodeConfig, result, source: str | None) -> None:
    text = target.tokenizer.decode(result.tokens, skip_special_tokens=True)
    summary = {"text": text, "new_tokens": len(result.tokens), "seconds": round(result.seconds, 4),
               "tokens_per_second": round(result.tokens_per_second, 3), "mode": cfg.mode,
               "tau": round(result.tau, 4), "target_forwards": result.target_forwards,
               "finished": result.finished, "head": source, "dtype": dtype_name(target.dtype),
               "config": asdict(cfg)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"\n[{cfg.mode}, {dtype_name(target.dtype)}] {len(result.tokens)} tokens in {result.seconds:.2f} s "
              f"({result.tokens_per_second:.1f} tok/s), tau {result.tau:.2f}, stop: {result.finished}",
              file=sys.stderr)


def _budget_line(budget: str, report: dict) -> str:
    chosen = report.get("context_choice") or {**report["chosen"], "speedup": report["expected_speedup"]}
    where = f" for a {report['context']}-token context" if "context" in report else ""
    shape = {k: v for k, v in chosen.items() if k != "speedup"}
    return (f"budget {budget}: {shape}{where} (auto expects {chosen['speedup']:.2f}x vanilla; "
            "--budget fixed for the flags' values)")


def cmd_budget(args: argparse.Namespace) -> int:
    """Choose (or show the cached choice of) the auto tree budget for this machine."""
    from .budget import auto_config
    check_runtime_args(args)
    target, head, _ = load_pair(args, need_head=True)
    _, report = auto_config(target, head, DecodeConfig(), refresh=args.refresh)
    report = {**report, "dtype": dtype_name(target.dtype), "dtype_report": target.dtype_report}
    if args.json:
        print(json.dumps(report))
        return 0
    why = target.dtype_report["reason"] if target.dtype_report else f"--dtype {args.dtype}"
    print(f"dtype: {dtype_name(target.dtype)} ({why})")
    print(f"chosen: {report['chosen']}  expected tau {report['expected_accept_length']:.2f}, "
          f"{report['expected_speedup']:.2f}x vanilla ({report['vanilla_tokens_per_s']:.1f} tok/s)")
    print("tree size  expected tau  round ms  expected tok/s")
    for r in report["curve"]:
        print(f"{r['total_tokens']:9d}  {r['accept_length']:12.2f}  {1000 * r['round_s']:8.1f}  "
              f"{r['tokens_per_s']:14.1f}")
    for row in report.get("by_context", []):
        shape = "/".join(str(row[k]) for k in ("total_tokens", "depth", "top_k", "draft_vocab"))
        print(f"at a {row['context']:4d}-token context: {shape} (total/depth/top_k/vocab), "
              f"{row['speedup']:.2f}x vanilla expected")
    print(f"report: {report['auto_file']}")
    return 0


def cmd_export_token_map(args: argparse.Namespace) -> int:
    from .tokenmap import export_token_map
    ids = export_token_map(args.out, args.head, args.k, args.model, args.force)
    print(f"wrote {ids.numel()} token ids to {args.out} (SGLang: --speculative-token-map {args.out})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m eagle", description="EAGLE-2 Explorer decoder")
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
    b.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_budget)
    t = sub.add_parser("export-token-map", help="write the draft vocabulary as SGLang's --speculative-token-map file")
    t.add_argument("--k", type=int, required=True, help="how many of the most frequent tokens (e.g. 32768)")
    t.add_argument("--out", type=Path, required=True, help="the .pt file to write")
    t.add_argument("--head", default="auto", help="head directory, or auto: the shipped head for --model")
    t.add_argument("--model", default=DEFAULT_MODEL, help="the target the shipped head belongs to")
    t.add_argument("--force", action="store_true", help="replace --out if it exists")
    t.set_defaults(func=cmd_export_token_map)
    for name in DELEGATED:
        sub.add_parser(name, add_help=False, help=f"see `python -m eagle {name} --help`")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every command; bench, prepare, train and distill are handed to their modules' mains, which
    run inside the same error boundary."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    return run_guarded(lambda: _run(argv))


def _run(argv: list[str]) -> int:
    check_argv(argv)
    args = build_parser().parse_args(argv)
    return args.func(args)


def _delegate(command: str, argv: list[str]) -> int:
    if command == "bench":
        from .bench import main as bench_main
        return bench_main(argv)
    from .train import main as train_main
    return train_main([command, *argv])
