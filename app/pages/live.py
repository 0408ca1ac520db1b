"""Live explorer: type a prompt and watch every round draft, verify and accept, then scrub back."""
from __future__ import annotations

import streamlit as st

from analysis.figures import tree_figure
from app import exports, render, runner, state
from app.settings import settings_form
from eagle.config import DecodeConfig
from eagle.decode import PromptError
from eagle.trace import Trace

try:
    from st_keyup import st_keyup  # generate-as-you-type; optional
except ImportError:  # without it the prompt box generates on Enter
    st_keyup = None

RUN, RUN_ID, STOP = "live_run", "live_run_id", "live_stop_requested"
PROMPT_KEY = "live_prompt"
DEBOUNCE_MS = 700  # long enough not to restart the decoder on every keystroke


def prompt_box() -> str:
    label = "Prompt (generates as you type; Enter also runs)" if st_keyup else "Prompt (Enter to generate)"
    hint = "Explain speculative decoding in one sentence."
    if st_keyup is not None:
        return st_keyup(label, key=PROMPT_KEY, debounce=DEBOUNCE_MS, placeholder=hint)
    return st.text_input(label, key=PROMPT_KEY, placeholder=hint)


def request_stop() -> None:
    st.session_state[STOP] = True


def settle_stop() -> None:
    """A Stop click interrupts the running script; on the rerun, keep the partial trace as stopped."""
    if not st.session_state.pop(STOP, False):
        return
    trace = st.session_state.get(RUN)
    if trace is not None and not runner.is_complete(trace):
        trace.header.meta["finished"] = "stopped"
        state.add_trace(trace)


def needs_run(trace: Trace | None, prompt: str, cfg: DecodeConfig) -> bool:
    """New prompt or settings, or the last run was interrupted by a rerun (not by Stop)."""
    return not runner.matches(trace, prompt, cfg) or not runner.is_complete(trace)


def show_stream(trace: Trace) -> None:
    render.show_tokens(trace)
    render.show_metrics(trace)
    step = runner.last_step(trace)
    if step is not None:
        render.show_figure(render.fit_tree(tree_figure(step)), key=f"live_stream_tree_{len(trace.steps)}")


def generate(models: state.Models, prompt: str, cfg: DecodeConfig) -> Trace | None:
    try:
        decoder, ids, trace = runner.prepare(models, prompt, cfg)
    except (PromptError, ValueError) as err:
        st.error(str(err))
        return None
    st.session_state[RUN] = trace
    st.session_state[RUN_ID] = st.session_state.get(RUN_ID, 0) + 1
    st.session_state.pop(STOP, None)
    stop_slot, live = st.empty(), st.empty()
    stop_slot.button("Stop", key="live_stop", icon=":material/stop_circle:", on_click=request_stop)

    def on_step(tr: Trace) -> bool:
        with live.container():
            show_stream(tr)
        return bool(st.session_state.get(STOP))

    runner.run(models, decoder, ids, trace, on_step,
               on_wait=lambda: live.info(runner.WAIT_MESSAGE))
    stop_slot.empty()
    live.empty()
    state.add_trace(trace)
    return trace


def show_trace(trace: Trace) -> None:
    render.show_tokens(trace)
    render.show_metrics(trace)
    if trace.header.meta.get("finished") == "stopped":
        st.caption(f"Stopped by the user after {len(trace.steps) - 1} round(s).")
    step = render.pick_step(trace, key=f"live_step_{st.session_state.get(RUN_ID, 0)}")
    pruned = st.toggle("Show reranked-away nodes (faded)", value=True, key="live_pruned")
    fig = tree_figure(step, show_pruned=pruned)
    render.show_figure(render.fit_tree(fig), key="live_tree")
    st.dataframe(render.nodes_table(step), hide_index=True, key="live_nodes")
    st.subheader("Downloads")
    exports.figure_download(fig, key="live_fig", stem=f"tree_round_{step.step}")
    exports.trace_downloads([trace], key="live_trace", stem="trace")
    st.caption(f"All {len(state.session_traces())} trace(s) of this session:")
    exports.trace_downloads(state.session_traces(), key="live_all", stem="session_traces")


def main() -> None:
    st.title("Live explorer")
    models = state.get_models()
    state.show_head_badge(models)
    cfg, error = settings_form("live", auto=lambda: state.auto_budget(models))
    prompt = prompt_box()
    if error:
        st.error(error)
        return
    settle_stop()
    if not prompt.strip():
        st.info("Type a prompt to start: each pause in typing (or Enter) decodes it with these settings.")
        return
    trace = st.session_state.get(RUN)
    if needs_run(trace, prompt, cfg):
        trace = generate(models, prompt, cfg)
    if trace is not None:
        show_trace(trace)


main()
