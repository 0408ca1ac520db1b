"""The modes a bench runs: MODE[:BUDGET][@DTYPE] parsed into a ModeSpec, the baselines added at every
other precision, and what an hf mode's output depends on."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...core.config import MODES, DecodeConfig, TreeShape
from ...core.lookup import LOOKUP_TOKENS
from ...models.precision import DTYPES

HF_MODES = ("hf", "hf_pld")
BASELINE_KINDS = ("vanilla", "hf", "hf_pld")  # what a speed-up is measured against
KINDS = (*MODES, *HF_MODES)
PLD_TOKENS = LOOKUP_TOKENS  # prompt_lookup_num_tokens for hf_pld: 10, as our own lookup branch's longest


@dataclass(frozen=True)
class ModeSpec:
    label: str  # as given on the command line, e.g. "dynamic:16/4/4/8192" or "hf@float32"
    kind: str  # one of KINDS
    overrides: tuple[tuple[str, int], ...] = ()
    budget: str = "fixed"  # "auto" / "adaptive" for dynamic:auto and dynamic:adaptive
    dtype: str | None = None  # "@float32" etc.; None: the run's --dtype

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_]+", "-", self.label).strip("-")


def parse_modes(text: str) -> list[ModeSpec]:
    """MODE[:BUDGET][@DTYPE], comma-separated; e.g. vanilla, dynamic:auto, hf@float32."""
    specs = []
    for label in (m.strip() for m in text.split(",") if m.strip()):
        body, at, dtype = label.partition("@")
        if at and dtype not in DTYPES:
            raise ValueError(f"mode {label!r}: unknown dtype {dtype!r}, choose from {', '.join(DTYPES)}")
        kind, _, budget = body.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown mode {kind!r}: choose from {', '.join(KINDS)}")
        overrides: tuple[tuple[str, int], ...] = ()
        if kind == "dynamic" and budget in ("auto", "adaptive"):
            specs.append(ModeSpec(label, kind, (), budget, dtype or None))
            continue
        if budget:
            parts = budget.split("/")
            if kind not in ("static", "dynamic") or not 3 <= len(parts) <= 4 or not all(p.isdigit() for p in parts):
                raise ValueError(f"mode {label!r}: a budget is static|dynamic:TOTAL/DEPTH/TOP_K[/DRAFT_VOCAB], "
                                 "dynamic:auto or dynamic:adaptive")
            overrides = tuple(zip(TreeShape.keys(), map(int, parts)))
        specs.append(ModeSpec(label, kind, overrides, dtype=dtype or None))
    if not specs or len({s.label for s in specs}) != len(specs):
        raise ValueError("--modes needs at least one mode and no repeats")
    return specs


def with_baselines(specs: list[ModeSpec], run_dtype: str, dtypes: tuple[str, ...]) -> list[ModeSpec]:
    """The modes plus each baseline mode given without a dtype (vanilla, hf, hf_pld) at every other
    precision in `dtypes`, so every speed-up can be against the fastest of its kind on this machine."""
    have = {(s.kind, s.dtype or run_dtype) for s in specs}
    extra = [ModeSpec(f"{s.kind}@{d}", s.kind, dtype=d) for s in specs if s.kind in BASELINE_KINDS and s.dtype is None
             for d in dtypes if (s.kind, d) not in have]
    return specs + list(dict.fromkeys(extra))


def hf_config(base: DecodeConfig, kind: str) -> dict:
    """What an hf mode's output depends on (stored in its trace header, checked on resume)."""
    return {"mode": kind, "max_new_tokens": base.max_new_tokens, "temperature": base.temperature,
            "top_p": base.top_p, "top_k_sampling": base.top_k_sampling, "seed": base.seed,
            "prompt_lookup_num_tokens": PLD_TOKENS if kind == "hf_pld" else None}

