"""Target, head and decode settings: the one place generate, bench, budget, profile and the notebook API
turn flags or keywords into typed DecodeSettings (checked by one validate()), a DecodeConfig and a
loaded model pair."""
from __future__ import annotations

import argparse
import numbers
import os
import sys
from dataclasses import dataclass, fields
from typing import Callable

from .checks import check_ranges, check_seed
from ..core.config import BUDGETS, MODES, PRESETS, DecodeConfig, SettingError, TreeShape
from ..models.head import AnyHead
from ..models.headio import locate_head, resolve_head
from ..models.loader import load_target
from ..models.location import DEFAULT_MODEL, locate_model, looks_like_path
from ..models.precision import DTYPE_CHOICES, parse_device
from ..models.target import Target
from .headprecision import HEAD_DTYPE_CHOICES, set_head_dtype

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
                   help="precision of the target; auto (default): bf16 on CUDA (fp16 without bf16), "
                        "on a CPU the faster of fp32 and bf16 as measured once on this machine")
    p.add_argument("--head-dtype", choices=HEAD_DTYPE_CHOICES, default="auto",
                   help="precision the draft head drafts in; int8: bf16 on int8 weights (CPU); auto (default): on a CPU "
                        "the fastest of fp32, bf16 and int8 for drafting, measured once on this machine, on CUDA the "
                        "target's; target: the target's")
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
    p.add_argument("--lookup-tokens", type=int, default=None,
                   help="a prompt-lookup branch of up to N tokens copied from the context beside the head's tree "
                        "(greedy dynamic decoding; 0 = off; default: on, at 10, under the auto and adaptive budgets)")
    p.add_argument("--budget", choices=("fixed", "auto", "adaptive"), default=None,
                   help="auto: pick total_tokens/depth/top_k/draft_vocab from this machine's measured costs "
                        "(default on CPU unless --preset or a tree flag is given; fixed on CUDA); adaptive: "
                        "auto's draft shape, with each round's tree size chosen from its path values")


# the tree flags (TreeShape.keys()) are None unless given: the preset's, the budget's or the default
INT_SETTINGS = ("max_new_tokens", "top_k_sampling", "seed", *TreeShape.keys(), "lookup_tokens", "threads")
FLOAT_SETTINGS = ("temperature", "top_p")
CHOICES: dict[str, tuple[str, ...]] = {"mode": MODES, "preset": tuple(sorted(PRESETS)), "budget": BUDGETS,
                                       "dtype": DTYPE_CHOICES, "head_dtype": HEAD_DTYPE_CHOICES}
PATH_SETTINGS = ("model", "head")  # a str or a pathlib.Path
_DEFAULTS = DecodeConfig()


def flag_name(name: str) -> str:
    """A setting as the CLI spells it: max_new_tokens -> --max-new-tokens."""
    return "--" + name.replace("_", "-")


def keyword_name(name: str) -> str:
    return name


@dataclass(frozen=True)
class DecodeSettings:
    """The generate command's flags, typed: what the CLI parses and the notebook takes by keyword. Both
    build one and call validate(), so a setting is checked the same way wherever it comes from. The
    types are checked on construction (a notebook keyword of the wrong type is one SettingError)."""
    mode: str = "dynamic"
    preset: str | None = None
    max_new_tokens: int = _DEFAULTS.max_new_tokens
    temperature: float = _DEFAULTS.temperature
    top_p: float = _DEFAULTS.top_p
    top_k_sampling: int = _DEFAULTS.top_k_sampling
    seed: int = _DEFAULTS.seed
    total_tokens: int | None = None
    depth: int | None = None
    top_k: int | None = None
    draft_vocab: int | None = None
    lookup_tokens: int | None = None  # None: the budget decides (DecodeConfig's -1)
    budget: str | None = None
    model: str = DEFAULT_MODEL
    head: str = "auto"
    device: str | None = None
    dtype: str = "auto"
    head_dtype: str = "auto"
    threads: int | None = None

    def __post_init__(self) -> None:
        optional = {f.name for f in fields(self) if f.default is None}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None or f.name not in optional:
                object.__setattr__(self, f.name, _typed(f.name, value))

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_keywords(cls, keywords: dict) -> "DecodeSettings":
        """The notebook's keywords; an unknown one is a SettingError listing the known ones."""
        unknown = sorted(set(keywords) - set(cls.names()))
        if unknown:
            raise SettingError(f"unknown setting {', '.join(unknown)}: the settings are {', '.join(cls.names())}")
        return cls(**keywords)

    @classmethod
    def from_args(cls, args: argparse.Namespace, mode: str | None = None) -> "DecodeSettings":
        """The CLI's parsed flags (a command without --mode passes the mode it decodes in)."""
        values = {k: getattr(args, k) for k in cls.names() if hasattr(args, k)}
        return cls(**values, **({"mode": mode} if mode else {}))

    def validate(self, name: Callable[[str], str] = keyword_name) -> DecodeConfig:
        """Choices, ranges and combinations, before anything loads; `name` spells a setting in the
        sentence (flag_name for the CLI). Returns the DecodeConfig these settings decode with."""
        for key, allowed in CHOICES.items():
            value = getattr(self, key)
            if value is not None and value not in allowed:
                raise SettingError(f"{name(key)} must be one of {', '.join(allowed)}, got {value!r}")
        check_seed(self.seed, name("seed"))
        check_ranges(self, name)
        try:
            parse_device(self.device)
        except ValueError as err:
            raise SettingError(f"{name('device')}: {err}") from None
        try:
            cfg = self.config()
        except SettingError as err:  # DecodeConfig names its field; say it as the caller spells it
            field, _, rest = str(err).partition(" ")
            raise SettingError(f"{name(field)} {rest}" if field in self.names() else str(err)) from None
        check_budget(self.budget, cfg.mode, name)
        return cfg

    def config(self) -> DecodeConfig:
        """The DecodeConfig: the preset's (or the defaults'), with the tree flags given applied."""
        base = PRESETS[self.preset] if self.preset else DecodeConfig()
        overrides = {k: getattr(self, k) for k in (*TreeShape.keys(), "lookup_tokens") if getattr(self, k) is not None}
        return base.with_(mode=self.mode, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                          top_p=self.top_p, top_k_sampling=self.top_k_sampling, seed=check_seed(self.seed),
                          **overrides)


def _typed(key: str, value: object) -> object:
    """`value` as the type of setting `key` (numpy integers are integers, Paths are text), or one
    SettingError naming the setting. A bool is not a number here: max_new_tokens=True is a slip."""
    if key in INT_SETTINGS:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        kind, cast = "an integer", int
    elif key in FLOAT_SETTINGS:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        kind, cast = "a number", float
    else:
        ok = isinstance(value, str) or (key in PATH_SETTINGS and isinstance(value, os.PathLike))
        kind, cast = "a string", str
    if not ok:
        raise SettingError(f"{key} must be {kind}, got {value!r} ({type(value).__name__})")
    return cast(value)


def config_from_args(args: argparse.Namespace, mode: str) -> DecodeConfig:
    """The DecodeConfig of parsed flags (bench: per mode); DecodeSettings.config does the work."""
    return DecodeSettings.from_args(args, mode).config()


def check_budget(budget: str | None, mode: str, name: Callable[[str], str] = flag_name) -> None:
    """A budget policy must be one of BUDGETS, and auto/adaptive size dynamic trees only."""
    if budget is not None and budget not in BUDGETS:
        raise SettingError(f"{name('budget')} must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if budget in ("auto", "adaptive") and mode != "dynamic":
        raise SettingError(f"{name('budget')} {budget} sizes dynamic trees only, but {name('mode')} is {mode}: "
                           f"drop {name('budget')} or use {name('mode')} dynamic")


def budget_mode(args: DecodeSettings, mode: str, device_type: str) -> str:
    """--budget as given (checked); fixed for a mode without a dynamic tree; otherwise auto on a CPU
    (the GPU-tuned defaults lose to vanilla there) unless the user chose the tree with --preset or an
    explicit size flag."""
    check_budget(args.budget, mode)
    if args.budget:
        return args.budget
    if mode != "dynamic":
        return "fixed"
    explicit = args.preset or any(getattr(args, k) is not None for k in TreeShape.keys())
    return "auto" if device_type == "cpu" and not explicit else "fixed"


@dataclass(frozen=True)
class ModelSpec:
    """Which model pair to load, as typed settings: the target, the head (None: no head), device and
    the precisions of each (eagle.tools.headprecision); `fastest_kernel`: an explicit dtype at its
    faster kernel, as auto runs it (load_target); `remeasure`: time auto's choices of precision and kernel
    again instead of reading them from the cache (a cache timed while other work shared the cores)."""
    model: str = DEFAULT_MODEL
    head: str | None = "auto"
    device: str | None = None
    dtype: str = "auto"
    head_dtype: str = "auto"
    fastest_kernel: bool = False
    remeasure: bool = False


def model_spec(args: DecodeSettings, need_head: bool) -> ModelSpec:
    """The model flags as a ModelSpec; a hub head id is located (downloaded, or refused offline) here,
    before the target takes time to load."""
    return ModelSpec(str(args.model), locate_head(args.head) if need_head else None, args.device, str(args.dtype),
                     str(args.head_dtype))


def check_local_paths(settings: DecodeSettings, need_head: bool) -> None:
    """A --model or --head given as a local path that is not there: its one sentence now, for a command
    that makes its output directory before loading (hub ids are looked up when they load)."""
    if need_head and looks_like_path(settings.head):  # the head first, as model_spec finds it before the load
        locate_head(settings.head)
    if settings.model != DEFAULT_MODEL and looks_like_path(settings.model):
        locate_model(settings.model)


@dataclass(frozen=True)
class LoadedPair:
    """A loaded target and head (None: plain decoding), with how auto chose the head's precision."""
    target: Target
    head: AnyHead | None
    head_source: str | None
    head_dtype_reason: str | None = None

    def reasons(self) -> list[str]:
        """How auto chose the target's precision, its kernel and the head's precision, one line each."""
        reports = {"dtype auto": self.target.dtype_report, "kernel": self.target.kernel_report}
        lines = [f"{what}: {report['reason']}" for what, report in reports.items() if report]
        return lines + ([f"head dtype auto: {self.head_dtype_reason}"] if self.head_dtype_reason else [])


def open_pair(spec: ModelSpec) -> LoadedPair:
    """The target at spec.dtype and the head, if one is named, at spec.head_dtype: the one way every
    front end (CLI, notebook, dashboard, bench) loads a pair."""
    target = load_target(spec.model, device=spec.device, dtype=spec.dtype, plain=spec.head is None,
                         fastest_kernel=spec.fastest_kernel, remeasure=spec.remeasure)
    if spec.head is None:
        return LoadedPair(target, None, None)
    head, source = resolve_head(target, spec.head)
    # a precision cache found timed under load (load_target) casts doubt on the head's choice of that session too
    remeasure = spec.remeasure or bool((target.dtype_report or {}).get("remeasured"))
    return LoadedPair(target, head, source, set_head_dtype(target, head, spec.head_dtype, remeasure))


def load_pair(spec: ModelSpec) -> tuple[Target, AnyHead | None, str | None]:
    """open_pair for a command: says on stderr how auto chose each precision (without a head, for
    plain decoding)."""
    pair = open_pair(spec)
    for line in pair.reasons():
        print(line, file=sys.stderr)
    return pair.target, pair.head, pair.head_source
