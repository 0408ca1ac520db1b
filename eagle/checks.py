"""Checks of a command's input that need no model, run before one loads (a bad flag costs no
loading time): argv encoding, output paths, --seed, --device and --threads. Shared by the CLI,
bench and train, each of which runs inside eagle.files.run_guarded."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from .target import parse_device

SEED_MAX = 2**63 - 1  # torch seeds are 64-bit; keeping to the signed range leaves room for seed + offset


def check_seed(seed: int) -> int:
    """--seed in the range torch takes (2**70 would fail deep inside it, as an unpacking overflow)."""
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"--seed must be an integer from 0 to 2**63 - 1, got {seed}")
    return seed


def check_runtime_args(args: argparse.Namespace) -> None:
    """Checks that need no model, run before one loads: a bad flag costs no loading time."""
    parse_device(args.device)
    if getattr(args, "seed", None) is not None:
        check_seed(args.seed)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)


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
