"""The Live explorer's pieces: the remembered prompt box, the throttled stream, the finished view.

Streaming must cost a few percent of decoding. The page runs in the decoder's process and the browser
on the same cores, so every element update costs the decoder time: the browser's frontend re-renders
its element tree once per message, about 20 ms of a core per update on a minimal page whatever the
element holds (the markup's size and styling made no measurable difference), and more on this one.
So while streaming the text, the summary and the tree travel together as ONE element, redrawn in place
at most every STREAM_S seconds, and at once on the first tree and the last round: two element updates
a second where text, metrics and tree used to make about nine. The tree in it is a static SVG
(analysis.tree_svg: about 1 ms to build, no plotly layout in the browser). The finished view then draws
the text, the metrics and the last round's full plotly chart into their own places."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import streamlit as st

from analysis.tree_plot import tree_figure
from analysis.tree_svg import CSS_CLASS, tree_svg
from eagle.core.config import DecodeConfig
from eagle.core.prompt import PromptError, encode_prompt
from eagle.records.trace import Trace
from eagle.tools.budget.report import AutoReport

from . import exports, render, runner, state
from .persist import save, saved, seed

try:
    from st_keyup import st_keyup  # generate-as-you-type; optional
except ImportError:  # without it the prompt box generates on Enter
    st_keyup = None

RUN, RUN_ID, STOP = "live_run", "live_run_id", "live_stop_requested"
REQUEST = "live_run_request"  # runner.request_key of the run in RUN
PROMPT_KEY = "live_prompt"
LONG_OK = "live_long_prompt_ok"  # the long prompt the user chose to run anyway
DEBOUNCE_MS = 700  # long enough not to restart the decoder on every keystroke
STREAM_S = 0.5  # two redraws a second while streaming: enough to follow the text and the trees
LONG_PROMPT_TOKENS = 1024  # above this the prefill alone takes seconds on a CPU: ask first
HINT = "Explain speculative decoding in one sentence."
clock = time.perf_counter  # the throttle's clock (a test swaps in a fake one)


def prompt_box() -> str:
    """The prompt, re-seeded from its saved copy when the user comes back from another page."""
    last = saved().get(PROMPT_KEY, "")
    if st_keyup is not None:
        # st_keyup takes `value` on its first draw only: after a page switch it is a first draw.
        text = st_keyup("Prompt (generates as you type; Enter also runs)", value=last, key=PROMPT_KEY,
                        debounce=DEBOUNCE_MS, placeholder=HINT)
        saved()[PROMPT_KEY] = text
        return text
    seed(PROMPT_KEY, last)
    text = st.text_input("Prompt (Enter to generate)", key=PROMPT_KEY, placeholder=HINT)
    save(PROMPT_KEY)
    return text


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


def needs_run(trace: Trace | None, prompt: str | list[dict], cfg: DecodeConfig, budget: str) -> bool:
    """New prompt or settings, or the last run was interrupted by a rerun (not by Stop)."""
    asked = st.session_state.get(REQUEST)
    return trace is None or asked != runner.request_key(prompt, cfg, budget) or not runner.is_complete(trace)


def long_prompt_ok(models: state.Models, prompt: str | list[dict], cfg: DecodeConfig,
                   report: Callable[[], AutoReport]) -> bool:
    """Short prompts run at once; a long one first shows its size and an estimated time, and runs
    when the user says so. Unencodable prompts pass: generate() reports them in one sentence."""
    try:
        n = len(encode_prompt(models.target.tokenizer, prompt, models.target.max_context))
    except (PromptError, ValueError):
        return True
    if n <= LONG_PROMPT_TOKENS or st.session_state.get(LONG_OK) == prompt:
        return True
    st.warning(f"This prompt is {n:,} tokens long. On this machine the prefill alone takes about "
               f"{estimate_seconds(n, cfg, report()):.0f} s or more before the first tree appears, and every "
               "round is slower over a long context.")
    if st.button("Run it anyway", key="live_long_run", icon=":material/play_arrow:"):
        st.session_state[LONG_OK] = prompt
        return True
    return False


def estimate_seconds(prompt_tokens: int, cfg: DecodeConfig, report: AutoReport | None) -> float:
    """Prefill at the measured 64-token verify throughput plus the answer at plain-decoding speed:
    a lower bound (attention over a long context is not in the measured costs)."""
    if not report:
        return math.nan
    t_verify = {int(n): t for n, t in report.t_verify.items()}
    widest = max(t_verify)
    return prompt_tokens * t_verify[widest] / widest + cfg.max_new_tokens * t_verify[1]


@dataclass
class Slots:
    """The page's fixed places: streaming and the finished view draw into the same ones, so the
    browser updates elements in place instead of mounting new ones. While streaming, `tokens` holds
    the Stop button and `metrics` the one streamed element; the finished view fills all four."""
    tokens: st.delta_generator.DeltaGenerator
    metrics: st.delta_generator.DeltaGenerator
    controls: st.delta_generator.DeltaGenerator
    chart: st.delta_generator.DeltaGenerator

    @classmethod
    def make(cls) -> "Slots":
        return cls(st.empty(), st.empty(), st.empty(), st.empty())


class Throttle:
    """True at most once per `interval` seconds (the first call and forced calls always)."""

    def __init__(self, interval: float) -> None:
        self.interval, self.last = interval, -math.inf

    def due(self, now: float, force: bool = False) -> bool:
        if not force and now - self.last < self.interval:
            return False
        self.last = now
        return True


def generate(models: state.Models, prompt: str | list[dict], cfg: DecodeConfig, budget: str, slots: Slots) -> Trace | None:
    def waiting() -> None:  # behind another session's generation
        slots.metrics.info(runner.WAIT_MESSAGE)  # where the streamed element will be

    try:
        decoder, ids, trace = runner.prepare(models, prompt, cfg, budget, waiting)
    except (PromptError, ValueError) as err:
        st.error(str(err))
        return None
    st.session_state[RUN] = trace
    st.session_state[REQUEST] = runner.request_key(prompt, cfg, budget)
    if trace.header.meta.get("note"):
        st.info(trace.header.meta["note"].capitalize() + ".")
    st.session_state[RUN_ID] = st.session_state.get(RUN_ID, 0) + 1
    st.session_state.pop(STOP, None)
    slots.tokens.button("Stop", key="live_stop", icon=":material/stop_circle:", on_click=request_stop)
    tick = Throttle(STREAM_S)

    def on_step(tr: Trace) -> bool:
        step = tr.steps[-1]
        # Round 1 brings the first tree: draw it at once. The finished view draws the last round's tree.
        if tick.due(clock(), force=step.step == 1 or step.finished):
            tree = render.svg_image(tree_svg(step), CSS_CLASS) if step.step > 0 and not step.finished else ""
            slots.metrics.html(render.stream_html(tr, tree))
        return bool(st.session_state.get(STOP))

    runner.run(models, decoder, ids, trace, on_step, on_wait=waiting)
    state.add_trace(trace)
    return trace


def show_trace(trace: Trace, slots: Slots) -> None:
    """The finished (or stopped) run: text, metrics, the round scrubber and its tree, the node table."""
    slots.tokens.html(render.token_html(trace.steps) if trace.steps else "<i>no tokens</i>")
    with slots.metrics.container():
        render.show_metrics(trace)
        if trace.header.meta.get("finished") == "stopped":
            st.caption(f"Stopped by the user after {max(0, len(trace.steps) - 1)} round(s).")
    if not trace.steps:
        slots.controls.empty()
        slots.chart.empty()
        return
    with slots.controls.container():
        step = render.pick_step(trace, key=f"live_step_{st.session_state.get(RUN_ID, 0)}")
        pruned = render.remembered_toggle("Show reranked-away nodes (faded)", "live_pruned", False)
    if step.step == 0:
        slots.chart.info("Round 0 is the prefill: the target reads the prompt and produces the first token; "
                         "no tree is drafted. Pick a later round to see one.")
        return
    fig = tree_figure(step, show_pruned=pruned)  # the paper layout, for the downloads
    with slots.chart.container():
        render.show_figure(render.screen_tree(step, pruned), key="live_tree")
        st.dataframe(render.nodes_table(step), hide_index=True, key="live_nodes")
        st.subheader("Downloads")
        exports.figure_download(fig, key="live_fig", stem=f"tree_round_{step.step}",
                                rebuild=lambda w: tree_figure(step, show_pruned=pruned, width=w))
        exports.trace_downloads([trace], key="live_trace", stem="trace", what="this run")
        runs = state.session_traces()
        exports.trace_downloads(runs, key="live_all", stem="session_traces", what=f"all {len(runs)} run(s)")
