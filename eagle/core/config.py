"""Decoding configuration: one dataclass, a few presets, validated in one place."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

Mode = Literal["vanilla", "static", "dynamic"]
MODES: tuple[str, ...] = ("vanilla", "static", "dynamic")
BUDGETS: tuple[str, ...] = ("fixed", "auto", "adaptive")  # tree budget policies (eagle.tools.session)
TEMPERATURE_MAX = 10.0  # beyond this, sampling is as good as uniform: a larger value is a typo
SEED_MAX = 2**63 - 1  # torch seeds are 64-bit; keeping to the signed range leaves room for seed + offset
# Inclusive ranges of the integer fields validate() checks without a model (a front end bounds its
# inputs by the same numbers).
RANGES: dict[str, tuple[int, int]] = {"max_new_tokens": (1, 100_000), "total_tokens": (1, 1024),
                                      "depth": (0, 32), "top_k": (1, 64), "seed": (0, SEED_MAX),
                                      "lookup_tokens": (-1, 64)}


@dataclass(frozen=True)
class ModelLimits:
    """What the loaded model can do: its context length and vocabulary size."""
    max_context: int
    vocab_size: int


class SettingError(ValueError, TypeError):
    """A setting (a command's flag or a notebook keyword) of the wrong type, out of its range or in a
    combination that cannot run: one sentence naming it. A ValueError (the commands' error boundary
    prints it as one line, exit 2) and a TypeError (what Python raises for a wrong keyword), so either
    catches it; `from eagle import SettingError`."""


@dataclass(frozen=True)
class TreeShape:
    """What a tree budget sets: nodes verified per round (root included), the draft's expansion rounds,
    its beam width and its draft vocabulary (0: the full vocabulary). Its field names are DecodeConfig's
    and the JSON files' (auto reports, bench summaries), so `of` reads either."""
    total_tokens: int
    depth: int
    top_k: int
    draft_vocab: int = 0

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, source: "DecodeConfig | Mapping") -> "TreeShape":
        """The shape of a DecodeConfig, or of a mapping holding these keys (a budget row, a JSON config)."""
        if isinstance(source, Mapping):
            return cls(*(source[k] for k in cls.keys()))
        return cls(*(getattr(source, k) for k in cls.keys()))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def label(self) -> str:
        """total/depth/top_k/draft vocab, as a bench mode names it: "60/6/10/0"."""
        return "/".join(str(v) for v in self.as_dict().values())


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
    # A prompt-lookup branch of up to this many tokens beside the head's tree (eagle.core.lookup; greedy
    # dynamic decoding only). 0 = off; -1 = the budget policy decides (eagle.tools.session: on, at
    # eagle.core.lookup.LOOKUP_TOKENS, under the auto and adaptive budgets when greedy; off otherwise).
    lookup_tokens: int = -1

    def validate(self, limits: ModelLimits | None = None) -> "DecodeConfig":
        """Raise ValueError with one clear sentence for any out-of-range field; with `limits`, also
        for what the model cannot do (more new tokens than its context, a draft vocabulary larger
        than its vocabulary)."""
        checks = [(self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")]
        checks += [(lo <= getattr(self, name) <= hi, f"{name} must be in {lo}..{hi}, got {getattr(self, name)}")
                   for name, (lo, hi) in RANGES.items()]
        checks += [
            (0.0 <= self.temperature <= TEMPERATURE_MAX,
             f"temperature must be in [0, {TEMPERATURE_MAX:g}], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k_sampling >= 0, f"top_k_sampling must be >= 0, got {self.top_k_sampling}"),
            (self.draft_vocab >= 0, f"draft_vocab must be >= 0, got {self.draft_vocab}"),
            (self.lookup_tokens <= 0 or (self.mode == "dynamic" and self.temperature == 0.0),
             f"lookup_tokens {self.lookup_tokens} needs greedy dynamic decoding (mode 'dynamic', temperature 0): "
             "a copied branch has no draft distribution to sample against"),
        ]
        if limits is not None:
            checks += [
                (self.max_new_tokens < limits.max_context,
                 f"max_new_tokens {self.max_new_tokens} is more than the model's context of "
                 f"{limits.max_context} tokens can hold (at most {limits.max_context - 1})"),
                (self.draft_vocab <= limits.vocab_size,
                 f"draft_vocab {self.draft_vocab} is larger than the model's vocabulary of {limits.vocab_size} "
                 "tokens (0 uses all of it)"),
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

    @property
    def shape(self) -> TreeShape:
        return TreeShape.of(self)

    def with_shape(self, shape: TreeShape) -> "DecodeConfig":
        return self.with_(**shape.as_dict())


# Presets: the paper's GPU budget, and the fastest budget of the measured 2-core CPU sweep
# (docs/cpu-sweep.md: 4/1/4 with a 4096-token draft vocabulary; still 0.86x vanilla there).
PRESETS: dict[str, DecodeConfig] = {
    "paper": DecodeConfig(total_tokens=60, depth=6, top_k=10),
    "cpu": DecodeConfig(total_tokens=4, depth=1, top_k=4, draft_vocab=4096),
    "vanilla": DecodeConfig(mode="vanilla"),
}
