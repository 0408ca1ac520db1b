"""Target, head and decode settings from command-line arguments: the one place generate, bench,
budget and the notebook API turn flags into a DecodeConfig and a loaded model pair."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from .checks import check_seed
from .config import BUDGETS, PRESETS, DecodeConfig
from .head import AnyHead, locate_head, resolve_head
from .target import DEFAULT_MODEL, DTYPE_CHOICES, Target, load_target

KNOBS_EPILOG = """knob names elsewhere (official EAGLE / SGLang / vLLM):
  --total-tokens  total_token / --speculative-num-draft-tokens / num_speculative_tokens + 1 (verified
                  nodes, root included; vLLM's static tree: speculative_token_tree, like --mode static)
  --depth         depth / --speculative-num-steps = depth + 1 (SGLang counts levels) / num_speculative_tokens
                  = depth + 1 for a chain (top_k 1), the longest path of speculative_token_tree for a tree
  --top-k         top_k / --speculative-eagle-topk / - (spelled out node by node in speculative_token_tree)
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


def check_budget(budget: str | None, mode: str) -> None:
    """A budget policy must be one of BUDGETS, and auto/adaptive size dynamic trees only."""
    if budget is not None and budget not in BUDGETS:
        raise ValueError(f"budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if budget in ("auto", "adaptive") and mode != "dynamic":
        raise ValueError(f"--budget {budget} sizes dynamic trees only, but --mode is {mode}: drop --budget or use "
                         "--mode dynamic")


def budget_mode(args: argparse.Namespace, mode: str, device_type: str) -> str:
    """--budget as given (checked); fixed for a mode without a dynamic tree; otherwise auto on a CPU
    (the GPU-tuned defaults lose to vanilla there) unless the user chose the tree with --preset or an
    explicit size flag."""
    check_budget(args.budget, mode)
    if args.budget:
        return args.budget
    if mode != "dynamic":
        return "fixed"
    explicit = args.preset or any(getattr(args, k) is not None for k in ("total_tokens", "depth", "top_k",
                                                                         "draft_vocab"))
    return "auto" if device_type == "cpu" and not explicit else "fixed"


@dataclass(frozen=True)
class ModelSpec:
    """Which model pair to load, as typed settings: the target, the head (None: no head), device, dtype."""
    model: str = DEFAULT_MODEL
    head: str | None = "auto"
    device: str | None = None
    dtype: str = "auto"


def model_spec(args: argparse.Namespace, need_head: bool) -> ModelSpec:
    """The model flags as a ModelSpec; a hub head id is located (downloaded, or refused offline) here,
    before the target takes time to load."""
    return ModelSpec(str(args.model), locate_head(args.head) if need_head else None, args.device, str(args.dtype))


def load_pair(spec: ModelSpec) -> tuple[Target, AnyHead | None, str | None]:
    """The target at spec.dtype (saying on stderr how auto chose it) and the head, if one is named."""
    target = load_target(spec.model, device=spec.device, dtype=spec.dtype)
    if target.dtype_report:
        print(f"dtype auto: {target.dtype_report['reason']}", file=sys.stderr)
    head, source = resolve_head(target, spec.head) if spec.head is not None else (None, None)
    return target, head, source
