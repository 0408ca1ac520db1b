"""`python -m eagle prepare|train|evaluate|distill|ablation`: argparse for the training side, run inside
eagle.records.files.run_guarded (a bad input is one sentence and exit code 2). eagle.cli hands these commands here."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from ..tools.checks import ArgumentParser, check_argv, check_output, check_runtime_args
from ..records.files import atomic_write, run_guarded
from ..models.head import HEAD_KINDS
from ..models.loader import load_target
from ..models.location import DEFAULT_MODEL
from ..models.precision import DTYPE_CHOICES
from ..models.target import Target
from ..records.questions import load_questions
from .ablation import (RECIPE_NAMES, AblationConfig, check_ablation_features, parse_fractions, parse_tree,
                       run_ablation)
from .data import read_sharegpt
from .distill import DistillConfig, regenerate
from .features import check_conversation_range, check_features, prepare_features
from .objective import LOSSES, default_loss
from .train import TrainConfig, check_more_features, evaluate_head, train_head



def _add_distill_args(p: argparse.ArgumentParser) -> None:
    d = DistillConfig()
    p.add_argument("--distill-dir", default=d.store or None,
                   help="self-distillation store (default: FEATURES/distill; the committed data is "
                        "data/distill/smollm2-135m-instruct)")
    p.add_argument("--distill-max-new-tokens", type=int, default=d.max_new_tokens, help="reply length (%(default)s)")
    p.add_argument("--distill-max-prompt-tokens", type=int, default=d.max_prompt_tokens,
                   help="skip longer prompts (%(default)s)")
    p.add_argument("--distill-batch", type=int, default=d.batch_size, help="prompts per batch (%(default)s)")
    p.add_argument("--distill-temperature", type=float, default=d.temperature, help="0 = greedy (%(default)s)")


def _add_prepare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conversations", type=int, default=800, help="ShareGPT conversations to read (%(default)s)")
    p.add_argument("--first-conversation", type=int, default=0,
                   help="keep conversations [N, --conversations) only: fresh data for a head warm-started on the "
                        "earlier ones (%(default)s)")
    p.add_argument("--max-len", type=int, default=512, help="truncate samples to this many tokens (%(default)s)")
    p.add_argument("--heldout-fraction", type=float, default=0.05, help="(%(default)s)")
    p.add_argument("--shard-size", type=int, default=64, help="(%(default)s)")
    p.add_argument("--sharegpt", default=None, help="ShareGPT JSON (default: the packaged file)")
    p.add_argument("--self-distill", action="store_true",
                   help="regenerate each first reply with the target before extracting features")
    _add_distill_args(p)


def _distill_config(args: argparse.Namespace) -> DistillConfig:
    return DistillConfig(args.distill_max_new_tokens, args.distill_max_prompt_tokens, args.distill_batch,
                         args.distill_temperature, args.seed, args.distill_dir or "")


def _run_prepare(args: argparse.Namespace, target: Target) -> None:
    prepare_features(target, args.features, args.conversations, args.max_len, args.heldout_fraction,
                     args.shard_size, args.seed, args.sharegpt, _distill_config(args) if args.self_distill else None,
                     head_type=args.head_type, first_conversation=args.first_conversation)


def _run_distill(args: argparse.Namespace, target: Target) -> None:
    """Fill a self-distillation store (no features): the long background job whose output is committed."""
    convs, report = read_sharegpt(args.sharegpt, limit=args.conversations)
    print(f"self-distill: {len(convs)} conversations read ({report.records_read} records); "
          f"{target.name} in {str(target.dtype).removeprefix('torch.')}", file=sys.stderr)
    stats = regenerate(target, convs, args.distill_dir, _distill_config(args))
    print(json.dumps(asdict(stats)))


def _add_train_args(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--out", default="runs/train", help="checkpoints, logs and the trained head")
    p.add_argument("--final-dir", default=None, help="also save the final head here (e.g. eagle/resources/heads/NAME)")
    p.add_argument("--overwrite", action="store_true", help="replace a head already in --final-dir")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--noise", type=float, default=d.noise)
    p.add_argument("--vocab-k", type=int, default=d.vocab_k, help="soft-CE vocabulary (0 = full)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-samples", type=int, default=d.eval_samples)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--init", default=d.init, help="warm start from this head directory")
    p.add_argument("--max-minutes", type=float, default=d.max_minutes,
                   help="end early (saving the head) after this many minutes; 0 = no limit")
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps,
                   help="training-time test: draft steps unrolled per position (%(default)s = no unrolling)")
    p.add_argument("--ttt-decay", type=float, default=d.ttt_decay,
                   help="loss weight of unrolled step j is DECAY**j (%(default)s)")
    p.add_argument("--loss", choices=LOSSES, default=None,
                   help="eagle1: SmoothL1 + 0.1 soft CE; token: soft CE only, the EAGLE-3 recipe "
                        "(default: token for --head-type eagle3, else eagle1)")
    p.add_argument("--draft-vocab-size", type=int, default=d.draft_vocab_size,
                   help="EAGLE-3: the head's own vocabulary is the K most frequent training tokens (d2t/t2d); "
                        "0 = the target's whole vocabulary (%(default)s)")
    _add_more_features_arg(p)


def _add_more_features_arg(p: argparse.ArgumentParser, more_help: str = "") -> None:
    p.add_argument("--more-features", default="",
                   help="another extraction (same target, head type, held-out rule) whose train split joins "
                        "--features' own, e.g. ShareGPT's original replies (prepare without --self-distill) beside "
                        "the self-distilled ones; held-out accuracy stays on --features" + more_help)


def _run_train(args: argparse.Namespace, target: Target) -> None:
    train_head(target, args.features, args.out, args.steps, args.lr, args.batch, args.final_dir,
               warmup=args.warmup, noise=args.noise, vocab_k=args.vocab_k,
               checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
               eval_samples=args.eval_samples, log_every=args.log_every, seed=args.seed,
               max_minutes=args.max_minutes, init=args.init, overwrite=args.overwrite, ttt_steps=args.ttt_steps,
               ttt_decay=args.ttt_decay, loss=args.loss or default_loss(args.head_type),
               head_type=args.head_type, draft_vocab_size=args.draft_vocab_size, more_features=args.more_features)


def _add_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", required=True, help="the head directory to score")
    p.add_argument("--batch", type=int, default=8, help="(%(default)s)")
    p.add_argument("--vocab-k", type=int, default=TrainConfig.vocab_k,
                   help="soft-CE vocabulary of the reported ce, as in train (%(default)s)")
    p.add_argument("--samples", type=int, default=0, help="only the first N held-out samples (0 = all)")
    p.add_argument("--json", default=None, help="also write the metrics to this JSON file")


def _run_evaluate(args: argparse.Namespace, target: Target) -> None:
    metrics = evaluate_head(target, args.head, args.features, args.batch, args.vocab_k, args.samples)
    text = json.dumps(metrics, indent=2)
    if args.json:
        atomic_write(Path(args.json), (text + "\n").encode("utf-8"))
    print(text)


def _add_ablation_args(p: argparse.ArgumentParser) -> None:
    d = AblationConfig(features="", out="")
    p.add_argument("--features", required=True,
                   help="an EAGLE-3 extraction (prepare --head-type eagle3; it holds the EAGLE-1 features too)")
    p.add_argument("--out", default="runs/ablation", help="runs/, ablation.json and ablation.log (%(default)s)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps of every point (%(default)s)")
    p.add_argument("--fractions", default=",".join(f"{f:g}" for f in d.fractions),
                   help="data fractions: the first f of the training samples, nested (%(default)s)")
    p.add_argument("--recipes", default=",".join(d.recipes), help=f"from {', '.join(RECIPE_NAMES)} (%(default)s)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps,
                   help="draft steps unrolled by eagle1-ttt and eagle3 (%(default)s)")
    p.add_argument("--ttt-decay", type=float, default=d.ttt_decay, help="(%(default)s)")
    p.add_argument("--draft-vocab-size", type=int, default=d.draft_vocab_size,
                   help="the eagle3 head's own vocabulary (%(default)s; 0 = the whole vocabulary)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="(%(default)s)")
    p.add_argument("--tau-per-category", type=int, default=d.tau_per_category,
                   help="also MT-bench tau per point over this many questions per category (0 = off)")
    p.add_argument("--questions", default=d.questions, help="question set for tau (%(default)s or a JSONL file)")
    p.add_argument("--tau-max-new-tokens", type=int, default=d.tau_max_new_tokens, help="(%(default)s)")
    p.add_argument("--tau-tree", default="/".join(map(str, d.tau_tree)),
                   help="TOTAL/DEPTH/TOP_K of the dynamic tree tau is measured with (%(default)s: the paper's)")
    _add_more_features_arg(p, "; each point is then also trained with them added, named RECIPE-FRACTION+more")


def ablation_config(args: argparse.Namespace) -> AblationConfig:
    """The typed settings of `ablation`, validated (one sentence for a bad flag)."""
    return AblationConfig(
        features=args.features, out=args.out, steps=args.steps, fractions=parse_fractions(args.fractions),
        recipes=tuple(r.strip() for r in args.recipes.split(",") if r.strip()), lr=args.lr, batch=args.batch,
        warmup=args.warmup, ttt_steps=args.ttt_steps, ttt_decay=args.ttt_decay,
        draft_vocab_size=args.draft_vocab_size, checkpoint_every=args.checkpoint_every, seed=args.seed,
        tau_per_category=args.tau_per_category, questions=args.questions,
        tau_max_new_tokens=args.tau_max_new_tokens, tau_tree=parse_tree(args.tau_tree),
        more_features=args.more_features).validate()


def _run_ablation(args: argparse.Namespace, target: Target) -> None:
    results = run_ablation(target, ablation_config(args))
    print(f"{len(results['points'])} point(s) in {Path(args.out) / 'ablation.json'}; figure and table: "
          f"python -m analysis ablation --results {Path(args.out) / 'ablation.json'} --out DIR")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m eagle", description="Train an EAGLE draft head.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"prepare": "extract target features (optionally self-distilling the replies first)",
                "train": "train the head on extracted features",
                "evaluate": "held-out accuracy per draft step of a saved head on a features directory",
                "distill": "regenerate ShareGPT first replies with the target into a resumable store",
                "ablation": "the recipe ablation and data-scaling curve: EAGLE-1, + training-time test, EAGLE-3 "
                            "at each data fraction (resumable)"}
    for name, help_text in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--model", default=DEFAULT_MODEL, help="target model (%(default)s)")
        p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
        p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                       help="target precision; auto: bf16 on CUDA, on a CPU the faster of fp32 and bf16 as "
                            "measured on this machine (%(default)s)")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
        p.add_argument("--seed", type=int, default=0, help="(%(default)s)")
        if name == "distill":
            p.add_argument("--conversations", type=int, default=None,
                           help="ShareGPT conversations to cover (default: all)")
            p.add_argument("--sharegpt", default=None, help="ShareGPT JSON (default: the packaged file)")
            _add_distill_args(p)
            p.set_defaults(distill_dir=f"data/distill/{DEFAULT_MODEL}")
            continue
        if name == "ablation":
            _add_ablation_args(p)
            continue
        p.add_argument("--features", default="runs/features", help="feature shard directory (%(default)s)")
        p.add_argument("--head-type", choices=HEAD_KINDS, default="eagle1",
                       help="eagle1: the EAGLE-1/2 head (last feature); eagle3: three target layers fused, own "
                            "vocabulary, token loss (%(default)s)")
        {"prepare": _add_prepare_args, "train": _add_train_args, "evaluate": _add_evaluate_args}[name](p)
    return parser


def _check_paths(args: argparse.Namespace) -> None:
    """Inputs that must exist and outputs that must be directories, checked before the model loads."""
    if getattr(args, "sharegpt", None) and not Path(args.sharegpt).is_file():
        raise FileNotFoundError(f"--sharegpt {args.sharegpt}: no such file")
    if args.command == "ablation":
        cfg = ablation_config(args)
        manifest = check_ablation_features(Path(cfg.features))
        if cfg.more_features:
            check_more_features(manifest, Path(cfg.more_features))
        if cfg.tau_per_category:
            load_questions(cfg.questions)  # a missing question file fails before training, not after it
        outputs = {"--out": args.out}
    elif args.command == "evaluate":
        if not (Path(args.head) / "config.json").is_file():
            raise FileNotFoundError(f"--head {args.head}: no head there (config.json missing)")
        if args.json:
            check_output(Path(args.json), "--json", directory=False)
            if Path(args.json).exists():
                raise ValueError(f"--json {args.json} already exists: give another file name or delete it.")
        check_features(Path(args.features))
        outputs = {}
    elif args.command == "train":
        if args.init and not (Path(args.init) / "config.json").is_file():
            raise FileNotFoundError(f"--init {args.init}: no head there (config.json missing)")
        manifest = check_features(Path(args.features))
        if args.more_features:
            check_more_features(manifest, Path(args.more_features))
        outputs = {"--out": args.out, "--final-dir": args.final_dir}
        if args.final_dir and (Path(args.final_dir) / "config.json").exists() and not args.overwrite:
            raise ValueError(f"--final-dir {args.final_dir} already holds a head: pass --overwrite to replace it.")
    else:
        if args.command == "prepare":
            check_conversation_range(args.first_conversation, args.conversations)
        outputs = {"--features": getattr(args, "features", None), "--distill-dir": args.distill_dir}
    for flag, path in outputs.items():
        if path:
            check_output(Path(path), flag, directory=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_guarded(lambda: _main(argv), "interrupted: finished shards, chunks and checkpoints are kept; "
                                            "rerun the same command to resume")


def _main(argv: list[str]) -> int:
    check_argv(argv)
    args = build_parser().parse_args(argv)
    check_runtime_args(args)
    _check_paths(args)
    # Features are stored in fp16 whatever the dtype; training keeps fp32 master weights and uses
    # autocast when the target runs in bf16/fp16.
    target = load_target(args.model, device=args.device, dtype=args.dtype)
    for report in (target.dtype_report, target.kernel_report):
        if report:
            print(f"dtype auto: {report['reason']}", file=sys.stderr)
    runs = {"prepare": _run_prepare, "train": _run_train, "evaluate": _run_evaluate, "distill": _run_distill,
            "ablation": _run_ablation}
    runs[args.command](args, target)
    return 0
