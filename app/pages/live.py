"""Live explorer: type a prompt and watch every round draft, verify and accept, then scrub back."""
from __future__ import annotations

import streamlit as st

from app import live, render, state
from app import prompt as prompt_ui
from app.settings import budget_policy, settings_form
from eagle.tools.budget.report import AutoReport

INTRO = """
**One round** = draft → verify → accept. The draft head (one decoder layer over the target's own
features) grows a tree of candidate next tokens; the target checks the whole tree in **one** forward
pass (tree attention mask); the longest path the target agrees with is the **accepted path** (red),
and the target's own next token after it is the **bonus token** (diamond), free because that same
pass computed it. A round therefore commits accepted drafts + 1 tokens; round 0 is the prefill.

**τ** = new tokens / target forward passes (the prefill counts as one). Plain decoding has τ = 1;
the speed-up is roughly τ × t(1) / t(round), so a bigger tree only pays if verifying it stays cheap.

**The tree budget**, e.g. "8 tokens, tree depth 2 (--depth 1), top-k 6, vocabulary 4096": the
target verifies 8 nodes a round (root included, `total_tokens`); **depth** is a node's level below
the root (the root's children are depth 1), the same depth the analysis pages and traces use, and
the CLI's `--depth` counts the draft's expansion steps after those children, so the tree reaches
`--depth` + 1; top-k is the children per expanded node and the beam width; vocabulary K means the
draft scores only the K most frequent tokens (verification stays exact over the full vocabulary).

**Rates**: *decoder tok/s* is the decoding alone (the rounds' own timings), *wall-clock tok/s*
includes drawing this page. Text backgrounds alternate per round: a long run of one colour is a
round that accepted many drafts.
"""


def main() -> None:
    render.first_screen_css()
    title, help_col = st.columns([5, 1], vertical_alignment="bottom")
    title.title("Live explorer")
    # A popover, not an expander: the explainer is about 450 px tall and would push the prompt, the
    # text and the tree below a 1280 x 800 window's fold.
    with help_col.popover("How to read this page", icon=":material/help:"):
        st.markdown(INTRO)
    models = state.get_models(state.dtype_choice())
    state.show_head_badge(models)
    fetched: list[AutoReport] = []  # the auto report, once the settings asked for it

    def auto() -> AutoReport:
        fetched[:] = [state.auto_budget(models)]
        return fetched[0]

    cfg, error = settings_form("live", auto=auto, limits=models.limits)
    prompt_ui.show_history()
    text = prompt_ui.editor()
    prompt = prompt_ui.conversation(text, prompt_ui.system_prompt())
    if error:
        st.error(error)
        return
    live.settle_stop()
    if not text.strip():
        st.info("Type a prompt to start: each pause in typing (or Enter; Ctrl+Enter in the multi-line "
                "editor) decodes it with these settings.")
        return
    if not live.long_prompt_ok(models, prompt, cfg, lambda: fetched[0] if fetched else state.auto_budget(models)):
        return
    slots = live.Slots.make()
    trace = st.session_state.get(live.RUN)
    budget = budget_policy("live", cfg.mode)
    if live.needs_run(trace, prompt, cfg, budget):
        trace = live.generate(models, prompt, cfg, budget, slots)
    if trace is not None:
        prompt_ui.keep_turn_button(trace, text)
        live.show_trace(trace, slots)


main()
