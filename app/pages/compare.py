"""Static vs dynamic: one prompt decoded with EAGLE-1's fixed tree and EAGLE-2's dynamic tree."""
from __future__ import annotations

from dataclasses import replace

import streamlit as st

from analysis.figures import accept_length_figure
from analysis.tree_plot import best_round, round_at_position, round_start, tree_figure
from analysis.tables import mode_summary, plain_summary, steps_frame, trace_seconds, with_baseline_rows
from app import exports, render, runner, state
from app import prompt as prompt_ui
from app.persist import save, saved, seed
from app.settings import budget_policy, settings_form
from eagle.core.config import DecodeConfig
from eagle.core.prompt import PromptError, encode_prompt
from eagle.records.trace import Trace

MODES = ("static", "dynamic")
RESULTS, RUN_ID = "cmp_results", "cmp_run_id"  # {"static": Trace, "dynamic": Trace, "vanilla": ...}; run counter
PROMPT = "cmp_prompt"
BASELINES = "cmp_baselines"  # rows of modes without a trace (prompt lookup), analysis.tables.with_baseline_rows


def run_both(models: state.Models, prompt: str, cfg: DecodeConfig, cols: list, baselines: bool) -> None:
    results: dict[str, Trace] = {}
    st.session_state[RESULTS] = results  # filled as we go, so an interrupted run still shows its part
    st.session_state[BASELINES] = []
    st.session_state[RUN_ID] = st.session_state.get(RUN_ID, 0) + 1  # fresh sliders for fresh traces
    slots = [col.empty() for col in cols] + ([st.empty()] if baselines else [])
    ids = None
    for mode, slot in zip(MODES + (("vanilla",) if baselines else ()), slots):
        trace, ids = run_one(models, prompt, replace(cfg, mode=mode), slot)
        if trace is None:
            return
        results[mode] = trace
    if baselines and ids is not None:
        slots[-1].caption("prompt lookup (HF generate)…")
        st.session_state[BASELINES] = [runner.prompt_lookup(models, ids, cfg,
                                                            lambda: slots[-1].info(runner.WAIT_MESSAGE))]
        slots[-1].empty()


def run_one(models: state.Models, prompt: str, cfg: DecodeConfig, slot) -> tuple[Trace | None, list[int] | None]:
    """One mode's generation with a progress caption in `slot`; (None, None) after an error box."""
    try:
        decoder, ids, trace = runner.prepare(models, prompt, cfg, budget_policy("cmp", cfg.mode),
                                             on_wait=lambda: slot.info(runner.WAIT_MESSAGE))
    except (PromptError, ValueError) as err:
        st.error(str(err))
        return None, None

    def on_step(tr: Trace) -> bool:
        slot.caption(f"{cfg.mode}: round {len(tr.steps) - 1}, {len(runner.generation(tr).tokens)} tokens…")
        return False

    runner.run(models, decoder, ids, trace, on_step, on_wait=lambda: slot.info(runner.WAIT_MESSAGE))
    slot.empty()
    state.add_trace(trace)
    return trace, ids


def pick_position(results: dict[str, Trace]) -> int:
    """One slider over generated positions for both columns: each shows the round that wrote that
    token, so the two trees answer the same point of the reply (round numbers differ between modes).
    It opens where the dynamic run's longest accepted path begins."""
    lengths = [len(runner.generation(results[m]).tokens) for m in MODES if m in results and results[m].steps]
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
    for mode, col in zip(MODES, st.columns(2)):  # vanilla has no tree: it only joins the table
        if mode in results and results[mode].steps:
            with col:
                show_column(mode, results[mode], pruned, position)
    traces = [t for t in results.values() if t.steps]
    steps = steps_frame(traces)
    st.subheader("Side by side")
    # One column per mode, one row per measure, in words; a static table, so nothing scrolls.
    table = with_baseline_rows(mode_summary(steps, trace_seconds(traces)), st.session_state.get(BASELINES, []))
    st.table(plain_summary(table))
    st.caption("One run of each on this machine, wall clock: a first look, not a benchmark "
               "(`python -m eagle bench --modes vanilla,hf_pld,static,dynamic` measures many prompts interleaved).")
    hist = accept_length_figure(steps)
    render.show_figure(hist, key="cmp_hist")
    exports.figure_download(hist, key="cmp_hist_dl", stem="accept_length")
    exports.trace_downloads(traces, key="cmp_traces", stem="static_vs_dynamic")


def main() -> None:
    st.title("Static vs dynamic")
    models = state.get_models(state.dtype_choice())
    state.show_head_badge(models)
    cfg, error = settings_form("cmp", modes=False, auto=lambda: state.auto_budget(models),
                               limits=models.limits)
    prompt = prompt_ui.multiline("Prompt (Enter is a new line; the button runs it)", PROMPT,
                                 saved().get(PROMPT, ""), "Write a haiku about draft trees.", height=90)
    saved()[PROMPT] = prompt  # re-seeds the editor after a page switch
    baselines = render.remembered_toggle("Also time vanilla and prompt lookup", "cmp_baselines_on", True,
                                         help="Two more runs of the prompt, for the speed-up rows of the table")
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
        run_both(models, prompt, cfg, st.columns(2), baselines)
    results = st.session_state.get(RESULTS)
    if results:
        show_results(results)


main()
