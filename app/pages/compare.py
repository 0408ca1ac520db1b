"""Static vs dynamic: one prompt decoded with EAGLE-1's fixed tree and EAGLE-2's dynamic tree."""
from __future__ import annotations

from dataclasses import replace

import streamlit as st

from analysis.figures import accept_length_figure, best_round, round_at_position, round_start, tree_figure
from analysis.tables import mode_summary, steps_frame, trace_seconds
from app import exports, render, runner, state
from app.persist import save, seed
from app.settings import budget_policy, settings_form
from eagle.config import DecodeConfig
from eagle.decode import PromptError, encode_prompt
from eagle.trace import Trace

MODES = ("static", "dynamic")
RESULTS, RUN_ID = "cmp_results", "cmp_run_id"  # {"static": Trace, "dynamic": Trace}; run counter


def run_both(models: state.Models, prompt: str, cfg: DecodeConfig, cols: list) -> None:
    results: dict[str, Trace] = {}
    st.session_state[RESULTS] = results  # filled as we go, so an interrupted run still shows its part
    st.session_state[RUN_ID] = st.session_state.get(RUN_ID, 0) + 1  # fresh sliders for fresh traces
    for mode, col in zip(MODES, cols):
        slot = col.empty()
        try:
            decoder, ids, trace = runner.prepare(models, prompt, replace(cfg, mode=mode),
                                                 budget_policy("cmp", mode),
                                                 on_wait=lambda slot=slot: slot.info(runner.WAIT_MESSAGE))
        except (PromptError, ValueError) as err:
            st.error(str(err))
            return
        results[mode] = trace

        def on_step(tr: Trace, slot=slot, mode=mode) -> bool:
            slot.caption(f"{mode}: round {len(tr.steps) - 1}, {len(runner.generation(tr).tokens)} tokens…")
            return False

        runner.run(models, decoder, ids, trace, on_step,
                   on_wait=lambda slot=slot: slot.info(runner.WAIT_MESSAGE))
        slot.empty()
        state.add_trace(trace)


def pick_position(results: dict[str, Trace]) -> int:
    """One slider over generated positions for both columns: each shows the round that wrote that
    token, so the two trees answer the same point of the reply (round numbers differ between modes).
    It opens where the dynamic run's longest accepted path begins."""
    lengths = [len(runner.generation(t).tokens) for t in results.values() if t.steps]
    key = f"cmp_position_{st.session_state.get(RUN_ID, 0)}"
    if max(lengths, default=0) < 2:
        return 0
    first = results.get("dynamic") or next(iter(results.values()))
    seed(key, round_start(first.steps, best_round(first.steps)) if first.steps else 0)
    position = st.slider("Generated token (both trees show the round that wrote it)", 0, max(lengths) - 1, key=key)
    save(key)
    return position


def show_column(mode: str, trace: Trace, pruned: bool, position: int) -> None:
    st.subheader(f"{mode} ({'EAGLE-1 fixed tree' if mode == 'static' else 'EAGLE-2 dynamic tree'})")
    if not runner.is_complete(trace):
        st.caption("Interrupted before the end: showing the rounds that finished.")
    render.show_metrics(trace)
    render.show_tokens(trace)
    index = round_at_position(trace.steps, position)
    step, start = trace.steps[index], round_start(trace.steps, index)
    st.caption(f"Round {step.step} wrote tokens {start}-{start + len(step.new_tokens) - 1}"
               + (" (this run ended before the chosen token)" if position >= start + len(step.new_tokens) else ""))
    if step.step == 0:
        st.info("Round 0 is the prefill: no tree is drafted.")
        return
    render.show_figure(render.screen_tree(step, pruned, render.HALF_TREE_WIDTH), key=f"cmp_tree_{mode}")
    exports.figure_download(tree_figure(step, show_pruned=pruned), key=f"cmp_tree_dl_{mode}",
                            stem=f"{mode}_tree_round_{step.step}",
                            rebuild=lambda w: tree_figure(step, show_pruned=pruned, width=w))


def show_results(results: dict[str, Trace]) -> None:
    pruned = render.remembered_toggle("Show reranked-away nodes (faded)", "cmp_pruned", False,
                                      help="Off by default: two full trees side by side get crowded")
    position = pick_position(results)
    for mode, col in zip(MODES, st.columns(2)):
        if mode in results and results[mode].steps:
            with col:
                show_column(mode, results[mode], pruned, position)
    traces = [t for t in results.values() if t.steps]
    steps = steps_frame(traces)
    st.subheader("Side by side")
    # One column per mode, one row per measure: thirteen measures side by side would not fit.
    summary = mode_summary(steps, trace_seconds(traces)).set_index("mode").T.astype(float).round(3)
    st.dataframe(summary, key="cmp_summary", width="stretch")
    hist = accept_length_figure(steps)
    render.show_figure(hist, key="cmp_hist")
    exports.figure_download(hist, key="cmp_hist_dl", stem="accept_length")
    exports.trace_downloads(traces, key="cmp_traces", stem="static_vs_dynamic")


def main() -> None:
    st.title("Static vs dynamic")
    models = state.get_models(state.dtype_choice())
    state.show_head_badge(models)
    cfg, error = settings_form("cmp", modes=False, auto=lambda: state.auto_budget(models))
    seed("cmp_prompt", "")
    prompt = st.text_input("Prompt", key="cmp_prompt", placeholder="Write a haiku about draft trees.")
    save("cmp_prompt")
    clicked = st.button("Run both modes", key="cmp_run", type="primary")
    if error:
        st.error(error)
        return
    if clicked:
        try:  # the decoder's one prompt check, before the previous results are cleared
            encode_prompt(models.target.tokenizer, prompt, models.target.max_context)
        except PromptError as err:
            st.error(str(err))
            return
        run_both(models, prompt, cfg, st.columns(2))
    results = st.session_state.get(RESULTS)
    if results:
        show_results(results)


main()
