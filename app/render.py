"""Shared page pieces: the round-coloured token stream, summary metrics, the step scrubber."""
from __future__ import annotations

import html
from dataclasses import asdict

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from eagle.trace import StepRecord, Trace

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
    return ('<div style="white-space:pre-wrap;line-height:1.9;font-family:ui-monospace,monospace;'
            f'font-size:0.95rem">{"".join(spans)}</div>')


def show_tokens(trace: Trace) -> None:
    st.html(token_html(trace.steps) if trace.steps else "<i>waiting for the first token…</i>")


def show_metrics(trace: Trace) -> None:
    """Tokens, tau (new tokens per target forward) and wall-clock tokens/s of one trace."""
    gen = generation(trace)
    cols = st.columns(4)
    cols[0].metric("Tokens", len(gen.tokens))
    cols[1].metric("τ", f"{gen.tau:.2f}", help="New tokens per target forward pass (prefill included)")
    cols[2].metric("Tokens / s", f"{gen.tokens_per_second:.1f}")
    cols[3].metric("Rounds", max(0, len(trace.steps) - 1), help=_finish_note(trace))


def _finish_note(trace: Trace) -> str:
    reason = trace.header.meta.get("finished")
    return {"eos": "ended at end-of-sequence", "max_new_tokens": "hit max new tokens",
            "context": "filled the context", "stopped": "stopped by the user"}.get(reason, "in progress")


def pick_step(trace: Trace, key: str) -> StepRecord:
    """A slider over every round of the trace (the last one by default)."""
    n = len(trace.steps)
    if n < 2:  # a slider needs min < max
        return trace.steps[0]
    idx = st.slider("Round (scrub back through every draft tree)", 0, n - 1, n - 1, key=key)
    return trace.steps[idx]


def nodes_table(step: StepRecord) -> pd.DataFrame:
    """The round's nodes, root included, verified ones first."""
    frame = pd.DataFrame([asdict(n) for n in step.nodes])
    if frame.empty:
        return frame
    return frame.sort_values(["kept", "depth", "rank"], ascending=[False, True, True])


def fit_tree(fig: go.Figure, max_height: int = 950) -> go.Figure:
    """Paper-layout trees grow 30 px per row; on screen, cap the height (plotly zooms for detail) so
    the node table stays within reach, and shrink the labels to match. Returns a copy: exports keep
    the paper layout."""
    fig = go.Figure(fig)
    if (fig.layout.height or 0) > max_height:
        fig.update_layout(height=max_height)
        fig.update_traces(textfont_size=10, selector=dict(mode="markers+text"))
    return fig


def compact(fig: go.Figure) -> go.Figure:
    """The paper layout's 18 px fonts crowd a half-width column: a copy with smaller text and margins."""
    fig = go.Figure(fig)
    fig.update_layout(font_size=12, title_font_size=14, margin=dict(l=10, r=10, t=60, b=10),
                      legend=dict(orientation="h", font_size=11))
    fig.update_traces(textfont_size=10, selector=dict(mode="markers+text"))
    return fig


def show_figure(fig: go.Figure, key: str) -> None:
    """analysis/ figures carry their own paper layout: keep it (theme=None), stretch to the column."""
    st.plotly_chart(fig, theme=None, width="stretch", key=key)
