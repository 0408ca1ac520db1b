"""The notebook API: `from eagle import explore; r = explore("prompt", mode="dynamic", max_new_tokens=64)`.

Settings are the `generate` command's flags by keyword (max_new_tokens=, total_tokens=, budget=, head=, ...).
An Explorer loads each model pair once and reuses it; `explore()` uses one default Explorer, made on first
use. (This module is not named explore.py: importing it would shadow the function `eagle.explore`.)
"""
from __future__ import annotations

import argparse
import functools
import threading
from dataclasses import asdict, dataclass

import pandas as pd

from .checks import check_runtime_args
from .loading import add_decode_args, budget_mode, config_from_args, load_pair
from .config import MODES, DecodeConfig
from .decode import Decoder, Generation, encode_prompt, generate
from .frames import nodes_frame, steps_frame
from .head import head_identity
from .target import Target, dtype_name
from .tools.budget import tuned_config
from .trace import Trace, TraceHeader

PairKey = tuple[str, str, str | None, str]  # (model, head, device, dtype) as given


@dataclass
class Exploration:
    """One decoded prompt: the reply, its trace, and the trace's tables."""
    text: str
    generation: Generation
    trace: Trace
    config: DecodeConfig
    head_source: str | None

    @property
    def tau(self) -> float:
        """New tokens per target forward, prefill included (eagle.stats)."""
        return self.generation.tau

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the generation's wall-clock seconds (eagle.stats)."""
        return self.generation.tokens_per_second

    def nodes(self) -> pd.DataFrame:
        """One row per drafted node of every round (eagle.frames.nodes_frame)."""
        return nodes_frame(self.trace)

    def steps(self) -> pd.DataFrame:
        """One row per round (eagle.frames.steps_frame)."""
        return steps_frame(self.trace)


def _settings(prompt: str, overrides: dict) -> argparse.Namespace:
    """The generate command's defaults with the keywords applied; an unknown keyword is a TypeError."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--mode", choices=MODES, default="dynamic")
    add_decode_args(parser)
    args = parser.parse_args([])
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"explore() got unknown settings {', '.join(unknown)}; it takes {', '.join(sorted(vars(args)))}")
    if overrides.get("mode", "dynamic") not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {overrides['mode']!r}")
    vars(args).update(overrides, prompt=prompt)
    return args


class Explorer:
    """Decodes prompts, loading each (model, head, device, dtype) pair once; safe to share across threads
    (loading is serialised by a lock; decoding itself is not, so share a pair between threads at your risk)."""

    def __init__(self) -> None:
        self._pairs: dict[PairKey, tuple[Target, object, str | None]] = {}
        self._lock = threading.Lock()

    @property
    def loaded(self) -> list[PairKey]:
        return list(self._pairs)

    def pair(self, args: argparse.Namespace, need_head: bool) -> tuple[Target, object, str | None]:
        key = (str(args.model), str(args.head) if need_head else "", args.device, str(args.dtype))
        with self._lock:
            if key not in self._pairs:
                self._pairs[key] = load_pair(args, need_head)
            return self._pairs[key]

    def explore(self, prompt: str, **settings) -> Exploration:
        args = _settings(prompt, settings)
        cfg = config_from_args(args, args.mode)
        check_runtime_args(args)
        target, head, source = self.pair(args, cfg.mode != "vanilla")
        ids = encode_prompt(target.tokenizer, prompt, target.max_context)
        costs = None
        budget = budget_mode(args, target.device.type)
        if cfg.mode == "dynamic" and budget != "fixed":
            cfg, costs, _ = tuned_config(target, head, cfg, budget, context=len(ids) + cfg.max_new_tokens // 2)
        result = generate(Decoder(target, head, cfg, costs), ids)
        header = TraceHeader(target.name, source, asdict(cfg), prompt, len(ids),  # seconds: the wall time
                             {"dtype": dtype_name(target.dtype), "device": target.device.type,
                              "seconds": result.seconds}, **head_identity(head))
        text = target.tokenizer.decode(result.tokens, skip_special_tokens=True)
        return Exploration(text, result, Trace(header, result.steps), cfg, source)


_DEFAULT_LOCK = threading.Lock()


@functools.cache
def _make_default() -> Explorer:
    return Explorer()


def default_explorer() -> Explorer:
    """The one Explorer that `explore()` uses: made on the first call (under a lock, so two threads
    cannot make two) and held by functools.cache. Make your own Explorer() to control its lifetime."""
    with _DEFAULT_LOCK:
        return _make_default()


def explore(prompt: str, **settings) -> Exploration:
    """Decode one prompt with the generate command's settings by keyword; the model pair stays loaded."""
    return default_explorer().explore(prompt, **settings)


__all__ = ["Exploration", "Explorer", "default_explorer", "explore"]
