"""Decoding configuration: one dataclass, a few presets, validated in one place."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Mode = Literal["vanilla", "static", "dynamic"]
MODES: tuple[str, ...] = ("vanilla", "static", "dynamic")
BUDGETS: tuple[str, ...] = ("fixed", "auto", "adaptive")  # tree budget policies (eagle.tools.session)
TEMPERATURE_MAX = 10.0  # beyond this, sampling is as good as uniform: a larger value is a typo


class SettingError(ValueError, TypeError):
    """A setting (a command's flag or a notebook keyword) of the wrong type, out of its range or in a
    combination that cannot run: one sentence naming it. A ValueError (the commands' error boundary
    prints it as one line, exit 2) and a TypeError (what Python raises for a wrong keyword), so either
    catches it; `from eagle import SettingError`."""


@dataclass(frozen=True)
class DecodeConfig:
    mode: Mode = "dynamic"
    max_new_tokens: int = 128
    # Sampling of the target; temperature 0 means greedy (the lossless-equality setting).
    temperature: float = 0.0
    top_p: float = 1.0
    top_k_sampling: int = 0  # 0 = off
    seed: int = 0
    # EAGLE-2 dynamic tree (paper: total_tokens 60, depth 6, top_k 10).
    total_tokens: int = 60  # nodes verified per round, root included
    depth: int = 6  # expansion rounds of the draft (0: verify only the root's top_k children)
    top_k: int = 10  # children per expanded node and beam width
    # Reduced draft vocabulary: score only the K most frequent tokens (0 = the full vocabulary).
    draft_vocab: int = 0

    def validate(self) -> "DecodeConfig":
        """Raise ValueError with one clear sentence for any out-of-range field."""
        checks = [
            (self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}"),
            (1 <= self.max_new_tokens <= 100_000, f"max_new_tokens must be in 1..100000, got {self.max_new_tokens}"),
            (0.0 <= self.temperature <= TEMPERATURE_MAX,
             f"temperature must be in [0, {TEMPERATURE_MAX:g}], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k_sampling >= 0, f"top_k_sampling must be >= 0, got {self.top_k_sampling}"),
            (1 <= self.total_tokens <= 1024, f"total_tokens must be in 1..1024, got {self.total_tokens}"),
            (0 <= self.depth <= 32, f"depth must be in 0..32, got {self.depth}"),
            (1 <= self.top_k <= 64, f"top_k must be in 1..64, got {self.top_k}"),
            (self.draft_vocab >= 0, f"draft_vocab must be >= 0, got {self.draft_vocab}"),
        ]
        for ok, message in checks:
            if not ok:
                raise SettingError(message)
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes) -> "DecodeConfig":
        return replace(self, **changes).validate()


# Presets: the paper's GPU budget, and the fastest budget of the measured 2-core CPU sweep
# (docs/cpu-sweep.md: 4/1/4 with a 4096-token draft vocabulary; still 0.86x vanilla there).
PRESETS: dict[str, DecodeConfig] = {
    "paper": DecodeConfig(total_tokens=60, depth=6, top_k=10),
    "cpu": DecodeConfig(total_tokens=4, depth=1, top_k=4, draft_vocab=4096),
    "vanilla": DecodeConfig(mode="vanilla"),
}
