"""Decoding settings widgets. Inputs are deliberately unclamped: DecodeConfig.validate() owns the
ranges, so an out-of-range value shows its one-sentence reason instead of being silently clipped."""
from __future__ import annotations

import streamlit as st

from eagle.config import MODES, DecodeConfig

# Small enough that a 2-core CPU answers while the user is still typing.
DEFAULTS = DecodeConfig(mode="dynamic", max_new_tokens=48, total_tokens=16, depth=4, top_k=4)


def settings_form(prefix: str, modes: bool = True) -> tuple[DecodeConfig | None, str | None]:
    """Sidebar widgets (keys prefixed per page) -> (config, None) or (None, error sentence)."""
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
        total_tokens=sb.number_input("Tree size (total_tokens)", value=DEFAULTS.total_tokens, step=4,
                                     key=f"{prefix}_total_tokens",
                                     help="Nodes verified per round, root included"),
        depth=sb.number_input("Draft depth", value=DEFAULTS.depth, step=1, key=f"{prefix}_depth"),
        top_k=sb.number_input("Top-k per expansion", value=DEFAULTS.top_k, step=1, key=f"{prefix}_top_k"),
        seed=sb.number_input("Seed", value=DEFAULTS.seed, step=1, key=f"{prefix}_seed"),
    )
    return build_config(mode, **values)


def build_config(mode: str, **values) -> tuple[DecodeConfig | None, str | None]:
    try:
        return DecodeConfig(mode=mode, **values).validate(), None
    except (ValueError, TypeError) as err:
        return None, f"Invalid setting: {err}."
