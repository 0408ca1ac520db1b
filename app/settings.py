"""Decoding settings widgets. Inputs are deliberately unclamped: DecodeConfig.validate() owns the
ranges, so an out-of-range value shows its one-sentence reason instead of being silently clipped.
Every widget is remembered across page switches (app.persist)."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from eagle.config import MODES, PRESETS, DecodeConfig
from eagle.tools.budget import vanilla_name

from . import benchmarks
from .persist import put, save, seed

# Small enough that a 2-core CPU answers while the user is still typing; the manual tree starts
# from the auto choice when there is one, else from the CPU preset.
DEFAULTS = DecodeConfig(mode="dynamic", max_new_tokens=48, total_tokens=PRESETS["cpu"].total_tokens,
                        depth=PRESETS["cpu"].depth, top_k=PRESETS["cpu"].top_k,
                        draft_vocab=PRESETS["cpu"].draft_vocab)
BUDGETS = ("auto", "adaptive", "manual")
POLICIES = {"auto": "auto", "adaptive": "adaptive", "manual": "fixed"}  # radio -> eagle.tools.session's budget
TREE_FIELDS = ("total_tokens", "depth", "top_k", "draft_vocab")


def _widget(make: Callable, key: str, default, *args, **kwargs):
    seed(key, default)
    value = make(*args, key=key, **kwargs)
    save(key)
    return value


def settings_form(prefix: str, modes: bool = True,
                  auto: Callable[[], dict] | None = None) -> tuple[DecodeConfig | None, str | None]:
    """Sidebar widgets (keys prefixed per page) -> (config, None) or (None, error sentence).
    `auto` returns the auto-budget report; with it the tree budget defaults to the machine-tuned one."""
    sb = st.sidebar
    sb.header("Decoding settings")
    mode = _widget(sb.selectbox, f"{prefix}_mode", DEFAULTS.mode, "Mode", MODES,
                   help="vanilla: no draft; static: EAGLE-1 fixed tree; dynamic: EAGLE-2 "
                        "context-aware tree") if modes else DEFAULTS.mode
    values = dict(
        temperature=_widget(sb.number_input, f"{prefix}_temperature", DEFAULTS.temperature,
                            "Temperature (0 = greedy)", step=0.1),
        max_new_tokens=_widget(sb.number_input, f"{prefix}_max_new_tokens", DEFAULTS.max_new_tokens,
                               "Max new tokens", step=8),
        seed=_widget(sb.number_input, f"{prefix}_seed", DEFAULTS.seed, "Seed", step=1),
    )
    budgets = BUDGETS if auto else BUDGETS[-1:]
    budget = _widget(sb.radio, f"{prefix}_budget", budgets[0], "Tree budget", budgets, horizontal=True,
                     on_change=_start_manual_from_auto, args=(prefix,),
                     help="auto: the tree size, depth, top-k and draft vocabulary with the most expected "
                          "tokens/s on this machine (the Tree budget page shows why), chosen for the prompt's "
                          "length as the CLI does; adaptive: auto's shape, each round verifying as many "
                          "candidates as pay for themselves")
    if budget in ("auto", "adaptive"):
        report = auto()
        st.session_state[f"{prefix}_auto_chosen"] = report["chosen"]
        show_expectation(report)
        return build_config(mode, **values, **report["chosen"])
    return build_config(mode, **values, **tree_inputs(prefix))


def budget_policy(prefix: str, mode: str) -> str:
    """The session's budget policy for a page's radio: fixed for a mode without a dynamic tree."""
    return POLICIES[st.session_state.get(f"{prefix}_budget", "manual")] if mode == "dynamic" else "fixed"


def _start_manual_from_auto(prefix: str) -> None:
    """Switching to manual starts the tree inputs from the budget auto chose, not from fixed defaults."""
    chosen = st.session_state.get(f"{prefix}_auto_chosen")
    if st.session_state.get(f"{prefix}_budget") == "manual" and chosen:
        for name in TREE_FIELDS:
            put(f"{prefix}_{name}", int(chosen[name]))


def show_expectation(report: dict) -> None:
    """auto's expected speed-up, with the benchmark's measured one beside it when a run exists."""
    measured = benchmarks.measured_auto_speedup()
    text = (f"Expected {report['expected_speedup']:.2f}x {vanilla_name(report)}, "
            f"τ {report['expected_accept_length']:.2f} "
            "(auto's cost model).")
    if measured is None:
        text += " Not benchmarked on this machine yet: `python -m eagle bench --modes vanilla,dynamic:auto`."
    else:
        text += f" Measured by `eagle bench`: {measured.speedup:.2f}x ({measured.where})."
    st.sidebar.caption(text)


def tree_inputs(prefix: str) -> dict:
    sb = st.sidebar
    return dict(
        total_tokens=_widget(sb.number_input, f"{prefix}_total_tokens", DEFAULTS.total_tokens,
                             "Tree size (total_tokens)", step=1, help="Nodes verified per round, root included"),
        depth=_widget(sb.number_input, f"{prefix}_depth", DEFAULTS.depth, "Expansion steps (--depth)", step=1,
                      help="Draft expansions after the root's children: the tree reaches depth "
                           "(levels below the root) of this + 1; 0 verifies only the root's children"),
        top_k=_widget(sb.number_input, f"{prefix}_top_k", DEFAULTS.top_k, "Top-k per expansion", step=1),
        draft_vocab=_widget(sb.number_input, f"{prefix}_draft_vocab", DEFAULTS.draft_vocab,
                            "Draft vocabulary (0 = full)", step=1024,
                            help="Score only the K most frequent tokens while drafting; "
                                 "verification stays exact"),
    )


def build_config(mode: str, **values) -> tuple[DecodeConfig | None, str | None]:
    try:
        return DecodeConfig(mode=mode, **values).validate(), None
    except (ValueError, TypeError) as err:
        return None, f"Invalid setting: {err}."
