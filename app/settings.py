"""Decoding settings widgets. Inputs are deliberately unclamped: DecodeConfig.validate() owns the
ranges, so an out-of-range value shows its one-sentence reason instead of being silently clipped."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from eagle.config import MODES, DecodeConfig

# Small enough that a 2-core CPU answers while the user is still typing.
DEFAULTS = DecodeConfig(mode="dynamic", max_new_tokens=48, total_tokens=16, depth=4, top_k=4)


BUDGETS = ("auto", "manual")


def settings_form(prefix: str, modes: bool = True,
                  auto: Callable[[], dict] | None = None) -> tuple[DecodeConfig | None, str | None]:
    """Sidebar widgets (keys prefixed per page) -> (config, None) or (None, error sentence).
    `auto` returns the auto-budget report; with it the tree budget defaults to the machine-tuned one."""
    sb = st.sidebar
    sb.header("Decoding settings")
    mode = sb.selectbox("Mode", MODES, index=MODES.index(DEFAULTS.mode), key=f"{prefix}_mode",
                        help="vanilla: no draft; static: EAGLE-1 fixed tree; dynamic: EAGLE-2 "
                             "context-aware tree") if modes else DEFAULTS.mode
    values = dict(
        temperature=sb.number_input("Temperature (0 = greedy)", value=DEFAULTS.temperature, step=0.1,
                                    key=f"{prefix}_temperature"),
        max_new_tokens=sb.number_input("Max new tokens", value=DEFAULTS.max_new_tokens, step=8,
                                       key=f"{prefix}_max_new_tokens"),
        seed=sb.number_input("Seed", value=DEFAULTS.seed, step=1, key=f"{prefix}_seed"),
    )
    budget = sb.radio("Tree budget", BUDGETS if auto else BUDGETS[1:], key=f"{prefix}_budget", horizontal=True,
                      help="auto: the tree size, depth, top-k and draft vocabulary with the most expected "
                           "tokens/s on this machine (the Tree budget page shows why)")
    if budget == "auto":
        report = auto()
        sb.caption(f"Expected {report['expected_speedup']:.2f}x vanilla, "
                   f"τ {report['expected_accept_length']:.2f}")
        return build_config(mode, **values, **report["chosen"])
    return build_config(mode, **values, **tree_inputs(prefix))


def tree_inputs(prefix: str) -> dict:
    sb = st.sidebar
    return dict(
        total_tokens=sb.number_input("Tree size (total_tokens)", value=DEFAULTS.total_tokens, step=4,
                                     key=f"{prefix}_total_tokens", help="Nodes verified per round, root included"),
        depth=sb.number_input("Draft depth", value=DEFAULTS.depth, step=1, key=f"{prefix}_depth"),
        top_k=sb.number_input("Top-k per expansion", value=DEFAULTS.top_k, step=1, key=f"{prefix}_top_k"),
        draft_vocab=sb.number_input("Draft vocabulary (0 = full)", value=DEFAULTS.draft_vocab, step=1024,
                                    key=f"{prefix}_draft_vocab",
                                    help="Score only the K most frequent tokens while drafting; "
                                         "verification stays exact"),
    )


def build_config(mode: str, **values) -> tuple[DecodeConfig | None, str | None]:
    try:
        return DecodeConfig(mode=mode, **values).validate(), None
    except (ValueError, TypeError) as err:
        return None, f"Invalid setting: {err}."
