"""Checks of a command's input that need no model, run before one loads (a bad flag costs no
loading time) and before anything is written: argv encoding, output paths, --seed, --device and the
range of every numeric flag (FLAG_RANGES). Shared by the CLI, bench and train, each of which runs
inside eagle.records.files.run_guarded."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable, NoReturn

import torch

from ..core.config import SEED_MAX, TEMPERATURE_MAX, SettingError
from ..models.precision import parse_device

# The range of each numeric flag, by argparse dest: (least, greatest or None for no bound). One table
# for every command, so a flag two commands share (--batch, --vocab-k) has one range; 0 is allowed
# where the flag's help gives it a meaning (off, all, no limit). Decoding settings are checked by
# DecodeConfig.validate instead, and --seed by check_seed.
FLAG_RANGES: dict[str, tuple[float, float | None]] = {
    "threads": (1, None),
    # prepare and distill
    "conversations": (1, None), "max_len": (1, None), "heldout_fraction": (0, 1), "shard_size": (1, None),
    "distill_max_new_tokens": (1, None), "distill_max_prompt_tokens": (1, None), "distill_batch": (1, None),
    "distill_temperature": (0, TEMPERATURE_MAX),
    # train and evaluate
    "steps": (0, None), "lr": (0, None), "batch": (1, None), "warmup": (0, None), "noise": (0, None),
    "vocab_k": (0, None), "checkpoint_every": (0, None), "eval_every": (0, None), "eval_samples": (1, None),
    "log_every": (1, None), "max_minutes": (0, None), "ttt_steps": (1, None), "ttt_decay": (0, 1),
    "draft_vocab_size": (0, None), "samples": (0, None),
    # ablation (its --steps, --fractions and --ttt-steps are checked further by AblationConfig.validate)
    "tau_per_category": (0, None), "tau_max_new_tokens": (1, None),
    # bench, profile, export-token-map (its upper bound is the head's vocabulary, checked there)
    "limit": (1, None), "per_category": (1, None), "prompts": (1, None), "k": (1, None),
    # analysis figures: calibration bins, and the raster scale (1 = 1200 px wide)
    "bins": (1, None), "scale": (0.1, 10),
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors (a wrong type, an unknown choice, a missing or unknown flag) are one
    SettingError sentence, which the commands' error boundary prints as one line with exit code 2,
    instead of a usage block; the same sentence in-process and from a shell."""

    def error(self, message: str) -> NoReturn:
        raise SettingError(f"{message} (see {self.prog} --help)")


def check_seed(seed: int, name: str = "--seed") -> int:
    """--seed in the range torch takes (2**70 would fail deep inside it, as an unpacking overflow)."""
    if not 0 <= seed <= SEED_MAX:
        raise SettingError(f"{name} must be an integer from 0 to 2**63 - 1, got {seed}")
    return seed


def check_runtime_args(args: argparse.Namespace) -> None:
    """Checks that need no model, run before one loads: a bad flag costs no loading time."""
    try:
        parse_device(args.device)
    except ValueError as err:
        raise SettingError(f"--device: {err}") from None
    if getattr(args, "seed", None) is not None:
        check_seed(args.seed)
    check_ranges(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)


def check_ranges(args: object, name: Callable[[str], str] | None = None) -> None:
    """Each flag of FLAG_RANGES that `args` (parsed flags or typed settings) holds (None: not given, a
    default meaning "all") in its range, named by `name` (default: as a flag). NaN fails every
    comparison, so it is refused with the rest; an infinity is named as such."""
    for dest, (low, high) in FLAG_RANGES.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag = name(dest) if name else "--" + dest.replace("_", "-")
        if isinstance(value, float) and math.isinf(value):
            raise SettingError(f"{flag} must be a finite number, got {value}")
        if not (value >= low and (high is None or value <= high)):
            span = f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]"
            raise SettingError(f"{flag} must be {span}, got {value}")


def check_argv(argv: list[str]) -> None:
    """Python hands undecodable argv bytes over as lone surrogates, which fail much later, far from
    their cause (in the tokenizer, or when printing): refuse them here, naming the argument."""
    for i, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"argument {i} ({arg[:err.start]!r}...) is not valid UTF-8") from None


def check_output(path: Path, flag: str, directory: bool) -> None:
    """An output path must be writable and of the right kind: a file for --trace, a directory for --out."""
    if directory and path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a directory: give a directory.")
    if not directory and path.is_dir():
        raise ValueError(f"{flag} {path} is a directory: give a file name.")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if existing != path and not existing.is_dir():
        raise ValueError(f"{flag} {path}: {existing} is not a directory.")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{flag} {path}: {existing} is not writable.")
