"""The notebook API: `from eagle import explore; r = explore("prompt", mode="dynamic", max_new_tokens=64)`.

Settings are the `generate` command's flags by keyword (max_new_tokens=, total_tokens=, budget=, head=, ...).
An Explorer loads each model pair once and reuses it; `explore()` uses one default Explorer, made on first
use. (This module is not named explore.py: importing it would shadow the function `eagle.explore`.)
"""
from __future__ import annotations

import argparse
import functools
import threading
from dataclasses import dataclass

import pandas as pd

from .checks import check_runtime_args
from .loading import ModelSpec, add_decode_args, budget_mode, check_budget, config_from_args, load_pair, model_spec
from .config import MODES, DecodeConfig
from .decode import Generation, generate
from .frames import nodes_frame, steps_frame
from .tools.session import Session
from .trace import Trace



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
        self._sessions: dict[ModelSpec, Session] = {}
        self._lock = threading.Lock()

    @property
    def loaded(self) -> list[ModelSpec]:
        return list(self._sessions)

    def session(self, spec: ModelSpec) -> Session:
        """The loaded pair for `spec`, loaded on first use."""
        with self._lock:
            if spec not in self._sessions:
                self._sessions[spec] = Session.of(*load_pair(spec))
            return self._sessions[spec]

    def explore(self, prompt: str, **settings) -> Exploration:
        args = _settings(prompt, settings)
        cfg = config_from_args(args, args.mode)
        check_runtime_args(args)
        check_budget(args.budget, cfg.mode)  # before a model loads
        session = self.session(model_spec(args, cfg.mode != "vanilla"))
        budget = budget_mode(args, cfg.mode, session.target.device.type)
        run = session.prepare(prompt, cfg, budget)  # run.header.meta["note"] says when auto fell back to vanilla
        result = generate(run.decoder, run.ids)
        run.header.meta["seconds"] = result.seconds  # the wall time, for the rates (eagle.stats)
        text = session.target.tokenizer.decode(result.tokens, skip_special_tokens=True)
        return Exploration(text, result, Trace(run.header, result.steps), run.config, session.head_source)


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
