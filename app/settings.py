"""Decoding settings widgets. Every number input is bounded by what the model and the decoder can do
(DecodeConfig's RANGES, the model's context and vocabulary, the largest whole number a browser holds
exactly), and its help says the bound in one sentence; the browser refuses a value outside it. The
config is then validated against the model too (DecodeConfig.validate(limits)), so a setting that passes
the inputs but not the model still gets its one-sentence reason. Every widget is remembered across page
switches (app.persist)."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from eagle.core.config import MODES, PRESETS, RANGES, TEMPERATURE_MAX, DecodeConfig, ModelLimits, TreeShape
from eagle.tools.budget.report import AutoReport

from . import benchmarks
from .persist import put, save, seed

# Small enough that a 2-core CPU answers while the user is still typing; the manual tree starts
# from the auto choice when there is one, else from the CPU preset.
DEFAULTS = DecodeConfig(mode="dynamic", max_new_tokens=48, total_tokens=PRESETS["cpu"].total_tokens,
                        depth=PRESETS["cpu"].depth, top_k=PRESETS["cpu"].top_k,
                        draft_vocab=PRESETS["cpu"].draft_vocab)
BUDGETS = ("auto", "adaptive", "manual")
POLICIES = {"auto": "auto", "adaptive": "adaptive", "manual": "fixed"}  # radio -> eagle.tools.session's budget
BROWSER_INT_MAX = 2**53 - 1  # a browser's number input holds whole numbers exactly up to here
SEED_HELP = f"0 to {BROWSER_INT_MAX:,}: the largest whole number a browser holds exactly"


def bounds(name: str, limits: ModelLimits | None) -> tuple[int, int]:
    """The inclusive range of an integer setting's input: DecodeConfig's, narrowed by the model."""
    lo, hi = RANGES.get(name, (0, BROWSER_INT_MAX))
    if name == "max_new_tokens" and limits is not None:
        hi = min(hi, limits.max_context - 1)
    if name == "draft_vocab":
        hi = limits.vocab_size if limits is not None else BROWSER_INT_MAX
    return lo, min(hi, BROWSER_INT_MAX)


def _int_input(sb, prefix: str, name: str, label: str, limits: ModelLimits | None, step: int = 1,
               why: str = "") -> int:
    lo, hi = bounds(name, limits)
    default = min(max(getattr(DEFAULTS, name), lo), hi)
    text = SEED_HELP if name == "seed" else f"{lo:,} to {hi:,}{why}"
    return _widget(sb.number_input, f"{prefix}_{name}", default, label, min_value=lo, max_value=hi, step=step,
                   help=text)


def _widget(make: Callable, key: str, default, *args, **kwargs):
    seed(key, default)
    value = make(*args, key=key, **kwargs)
    save(key)
    return value


def settings_form(prefix: str, modes: bool = True, auto: Callable[[], AutoReport] | None = None,
                  limits: ModelLimits | None = None) -> tuple[DecodeConfig | None, str | None]:
    """Sidebar widgets (keys prefixed per page) -> (config, None) or (None, error sentence).
    `auto` returns the auto-budget report; with it the tree budget defaults to the machine-tuned one.
    `limits` (the loaded model's) bound max new tokens and the draft vocabulary."""
    sb = st.sidebar
    sb.header("Decoding settings")
    mode = _widget(sb.selectbox, f"{prefix}_mode", DEFAULTS.mode, "Mode", MODES,
                   help="vanilla: no draft; static: EAGLE-1 fixed tree; dynamic: EAGLE-2 "
                        "context-aware tree") if modes else DEFAULTS.mode
    values = dict(
        temperature=_widget(sb.number_input, f"{prefix}_temperature", DEFAULTS.temperature,
                            "Temperature (0 = greedy)", min_value=0.0, max_value=TEMPERATURE_MAX, step=0.1,
                            help=f"0 to {TEMPERATURE_MAX:g}: beyond that, sampling is as good as uniform"),
        max_new_tokens=_int_input(sb, prefix, "max_new_tokens", "Max new tokens", limits, step=8,
                                  why=": the model's context, less one prompt token" if limits else ""),
        seed=_int_input(sb, prefix, "seed", "Seed", limits),
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
        st.session_state[f"{prefix}_auto_chosen"] = report.chosen
        show_expectation(report)
        return build_config(mode, limits, **values, **report.chosen)
    return build_config(mode, limits, **values, **tree_inputs(prefix, limits))


def budget_policy(prefix: str, mode: str) -> str:
    """The session's budget policy for a page's radio: fixed for a mode without a dynamic tree."""
    return POLICIES[st.session_state.get(f"{prefix}_budget", "manual")] if mode == "dynamic" else "fixed"


def _start_manual_from_auto(prefix: str) -> None:
    """Switching to manual starts the tree inputs from the budget auto chose, not from fixed defaults."""
    chosen = st.session_state.get(f"{prefix}_auto_chosen")
    if st.session_state.get(f"{prefix}_budget") == "manual" and chosen:
        for name in TreeShape.keys():
            put(f"{prefix}_{name}", int(chosen[name]))


def show_expectation(report: AutoReport) -> None:
    """auto's expected speed-up, with the benchmark's measured one beside it when a run exists."""
    measured = benchmarks.measured_auto_speedup()
    text = (f"Expected {report.expected_speedup:.2f}x {report.vanilla_label}, "
            f"τ {report.expected_accept_length:.2f} "
            "(auto's cost model).")
    if measured is None:
        text += " Not benchmarked on this machine yet: `python -m eagle bench --modes vanilla,dynamic:auto`."
    else:
        text += f" Measured by `eagle bench`: {measured.speedup:.2f}x ({measured.where})."
    st.sidebar.caption(text)


def tree_inputs(prefix: str, limits: ModelLimits | None = None) -> dict:
    sb = st.sidebar
    return dict(
        total_tokens=_int_input(sb, prefix, "total_tokens", "Tree size (total_tokens)", limits,
                                why=": nodes verified per round, root included"),
        depth=_int_input(sb, prefix, "depth", "Expansion steps (--depth)", limits,
                         why=": draft expansions after the root's children, so the tree reaches depth "
                             "(levels below the root) of this + 1; 0 verifies only the root's children"),
        top_k=_int_input(sb, prefix, "top_k", "Top-k per expansion", limits),
        draft_vocab=_int_input(sb, prefix, "draft_vocab", "Draft vocabulary (0 = full)", limits, step=1024,
                               why=" (the model's vocabulary): score only the K most frequent tokens while "
                                   "drafting; verification stays exact"),
    )


def build_config(mode: str, limits: ModelLimits | None = None, **values) -> tuple[DecodeConfig | None, str | None]:
    try:
        return DecodeConfig(mode=mode, **values).validate(limits), None
    except (ValueError, TypeError) as err:
        return None, f"Invalid setting: {err}."
