"""The notebook API: `from eagle import explore; r = explore("prompt", mode="dynamic", max_new_tokens=64)`.

Settings are the `generate` command's flags by keyword (max_new_tokens=, total_tokens=, budget=, head=, ...),
typed as eagle.tools.loading.DecodeSettings and checked by the same validate() the CLI runs, before anything
loads: a bad one (wrong type, out of range, a pair that cannot run) is one SettingError naming it.
An Explorer loads each model pair once and reuses it; `explore()` uses one default Explorer, made on first
use. (This module is not named explore.py: importing it would shadow the function `eagle.explore`.)
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import pandas as pd
import torch

from .tools.loading import DecodeSettings, ModelSpec, budget_mode, load_pair, model_spec
from .core.config import DecodeConfig, SettingError
from .core.decode import Generation, generate
from .core.prompt import PromptError
from .models.location import ModelLoadError
from .frames import nodes_frame, steps_frame
from .tools.session import Session
from .records.trace import Trace



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
        """New tokens per target forward, prefill included (eagle.records.stats)."""
        return self.generation.tau

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the generation's wall-clock seconds (eagle.records.stats)."""
        return self.generation.tokens_per_second

    def nodes(self) -> pd.DataFrame:
        """One row per drafted node of every round (eagle.frames.nodes_frame)."""
        return nodes_frame(self.trace)

    def steps(self) -> pd.DataFrame:
        """One row per round (eagle.frames.steps_frame)."""
        return steps_frame(self.trace)


def checked_settings(prompt: object, keywords: dict) -> tuple[DecodeSettings, DecodeConfig]:
    """The prompt and the keywords as typed settings and their DecodeConfig, checked before anything loads
    by the validate() the CLI runs: SettingError naming the keyword otherwise."""
    if not isinstance(prompt, str):
        raise SettingError(f"prompt must be a string, got {prompt!r} ({type(prompt).__name__})")
    if not prompt.strip():
        raise PromptError("The prompt is empty: type something to generate from.")
    settings = DecodeSettings.from_keywords(keywords)
    return settings, settings.validate()


class Explorer:
    """Decodes prompts, loading each (model, head, device, dtype) pair once; safe to share across threads
    (loading is serialised by a lock; decoding itself is not, so share a pair between threads at your risk)."""

    def __init__(self) -> None:
        self._sessions: dict[ModelSpec, Session] = {}
        self._lock = threading.Lock()

    @property
    def loaded(self) -> list[ModelSpec]:
        return list(self._sessions)

    def _load(self, settings: DecodeSettings, need_head: bool) -> Session:
        """The pair the settings name; a head or model that cannot be found or read is the keyword's
        SettingError (the CLI prints the same sentence)."""
        try:
            spec = model_spec(settings, need_head)
        except (OSError, ModelLoadError) as err:  # no such head directory, or a hub id not to be had
            raise SettingError(f"head={settings.head!r}: {err}") from None
        try:
            return self.session(spec)
        except ModelLoadError as err:
            raise SettingError(f"model={settings.model!r}: {err}") from None

    def session(self, spec: ModelSpec) -> Session:
        """The loaded pair for `spec`, loaded on first use."""
        with self._lock:
            if spec not in self._sessions:
                self._sessions[spec] = Session.of(*load_pair(spec))
            return self._sessions[spec]

    def explore(self, prompt: str, **keywords) -> Exploration:
        settings, cfg = checked_settings(prompt, keywords)
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        session = self._load(settings, cfg.mode != "vanilla")
        budget = budget_mode(settings, cfg.mode, session.target.device.type)
        run = session.prepare(prompt, cfg, budget)  # run.header.meta["note"] says when auto fell back to vanilla
        result = generate(run.decoder, run.ids)
        run.header.meta["seconds"] = result.seconds  # the wall time, for the rates (eagle.records.stats)
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


__all__ = ["Exploration", "Explorer", "SettingError", "default_explorer", "explore"]
