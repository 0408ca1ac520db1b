"""Shared page pieces: the round-coloured token stream, summary metrics, the step scrubber."""
from __future__ import annotations

import base64
import html
import math
from dataclasses import asdict

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analysis.tree_plot import best_round, tree_figure
from eagle.records.stats import tokens_per_second
from eagle.records.trace import StepRecord, Trace

from .persist import save, seed
from .runner import generation

# Alternating pastel backgrounds: adjacent rounds always differ; accepted drafts show as long runs.
ROUND_COLOURS = ("#dbeafe", "#fde68a", "#d1fae5", "#fbcfe8", "#e9d5ff", "#fed7aa")
PREFILL_COLOUR = "#e5e7eb"


def token_html(steps: list[StepRecord]) -> str:
    """One <span> per round, escaped, with a tooltip naming the round and what it accepted."""
    spans = []
    for s in steps:
        colour = PREFILL_COLOUR if s.step == 0 else ROUND_COLOURS[s.step % len(ROUND_COLOURS)]
        tip = ("prefill" if s.step == 0 else
               f"round {s.step}: {s.accept_length - 1} draft token(s) accepted + bonus {s.bonus_text!r}")
        spans.append(f'<span title="{html.escape(tip)}" style="background:{colour};border-radius:3px;'
                     f'padding:1px 0">{html.escape(s.new_text)}</span>')
    return ('<div class="eagle-tokens" style="white-space:pre-wrap;line-height:1.9;font-family:ui-monospace,monospace;'
            f'font-size:0.95rem">{"".join(spans)}</div>')


def show_tokens(trace: Trace) -> None:
    st.html(token_html(trace.steps) if trace.steps else "<i>waiting for the first token…</i>")


def decoder_seconds(trace: Trace) -> float:
    """The decoding alone: the sum of every round's own timings (prefill, draft, verify, commit)."""
    return sum(sum(s.timings.values()) for s in trace.steps)


def metric_values(trace: Trace) -> list[tuple[str, str, str | None]]:
    """(label, value, help) of the run's summary: tokens, tau (new tokens per target forward), rounds,
    and two rates: the decoder's own (from the trace timings) and the wall clock's, drawing included."""
    gen = generation(trace)
    return [("Tokens", str(len(gen.tokens)), None),
            ("τ", f"{gen.tau:.2f}", "New tokens per target forward pass (prefill included)"),
            ("Rounds", str(max(0, len(trace.steps) - 1)), _finish_note(trace)),
            ("Decoder tok/s", _rate(tokens_per_second(len(gen.tokens), decoder_seconds(trace))),
             "Tokens over the decoder's own time (the rounds' timings in the trace)"),
            ("Wall-clock tok/s", _rate(gen.tokens_per_second),
             "Tokens over the wall-clock time of the generation, drawing this page included")]


def show_metrics(trace: Trace) -> None:
    """The summary as Streamlit metrics, with their help tooltips (the finished view)."""
    for col, (label, value, tip) in zip(st.columns(5), metric_values(trace)):
        col.metric(label, value, help=tip)


def metrics_html(trace: Trace) -> str:
    """The same summary as HTML laid out like show_metrics' row, for the streamed element (a block of
    five columns and five metrics would be five more browser updates a redraw)."""
    cells = "".join(f'<div style="flex:1" title="{html.escape(tip or label)}"><div style="font-size:0.875rem">'
                    f'{html.escape(label)}</div><div data-metric="{html.escape(label)}" '
                    f'style="font-size:2.25rem;line-height:1.4">{html.escape(value)}</div></div>'
                    for label, value, tip in metric_values(trace))
    return f'<div class="eagle-live-metrics" style="display:flex;gap:1rem">{cells}</div>'


def stream_html(trace: Trace, tree_html: str = "") -> str:
    """What the Live page shows while decoding, as one element: the text, the summary row and the
    newest round's tree (empty at the prefill and the last round)."""
    return token_html(trace.steps) + metrics_html(trace) + tree_html


def _rate(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.1f}"  # NaN: nothing timed yet


def _finish_note(trace: Trace) -> str:
    reason = trace.header.meta.get("finished")
    return {"eos": "ended at end-of-sequence", "max_new_tokens": "hit max new tokens",
            "context": "filled the context", "stopped": "stopped by the user"}.get(reason, "in progress")


def pick_step(trace: Trace, key: str) -> StepRecord:
    """A slider over every round of the trace, opening on the most informative one (the longest
    accepted path, said in a caption); its position is remembered across page switches."""
    n = len(trace.steps)
    if n < 2:  # a slider needs min < max
        return trace.steps[0]
    best = best_round(trace.steps)
    seed(key, best)
    idx = st.slider("Round (scrub back through every draft tree)", 0, n - 1, key=key)
    save(key)
    if idx == best:
        st.caption(f"Opened on round {trace.steps[best].step}: the longest accepted path of this run "
                   f"({max(0, len(trace.steps[best].accepted) - 1)} draft token(s) + bonus).")
    return trace.steps[idx]


def remembered_toggle(label: str, key: str, default: bool, **kwargs) -> bool:
    seed(key, default)
    value = st.toggle(label, key=key, **kwargs)
    save(key)
    return value


def nodes_table(step: StepRecord) -> pd.DataFrame:
    """The round's nodes, root included, verified ones first."""
    frame = pd.DataFrame([asdict(n) for n in step.nodes])
    if frame.empty:
        return frame
    return frame.sort_values(["kept", "depth", "rank"], ascending=[False, True, True])


# The narrowest the tree charts are drawn at on a 1280 px window with the sidebar open (labels are
# elided to fit it; a wider window only gives them more room) and the tallest that keeps the chart
# and its legend in view.
LIVE_TREE_WIDTH, HALF_TREE_WIDTH, TREE_MAX_HEIGHT = 860, 420, 520


def screen_tree(step: StepRecord, show_pruned: bool, width: int = LIVE_TREE_WIDTH) -> go.Figure:
    """The round's tree as drawn on screen: capped in height, labels fitted to `width`."""
    return tree_figure(step, show_pruned=show_pruned, width=width, max_height=TREE_MAX_HEIGHT)


def first_screen_css() -> None:
    """Less empty space above the title (Streamlit's default top padding is 6 rem), so the prompt, the
    text and the tree fit a 1280 x 800 window. Drawn once per script run, not while streaming."""
    st.html("<style>.stMainBlockContainer, .block-container {padding-top: 2.5rem}</style>")


def svg_image(svg: str, css_class: str) -> str:
    """HTML showing an SVG drawing: st.html's sanitizer keeps the HTML profile only (an inline <svg> is
    removed), so the drawing travels as an <img> of a data URI, which the browser paints as one image."""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img class="{css_class}" alt="draft tree" src="data:image/svg+xml;base64,{data}" style="max-width:100%">'


def show_figure(fig: go.Figure, key: str) -> None:
    """analysis/ figures carry their own paper layout: keep it (theme=None), stretch to the column."""
    st.plotly_chart(fig, theme=None, width="stretch", key=key)
