"""Pure plotly figures for the paper and the dashboard: each function takes frames (or one step) and
returns a go.Figure laid out for static export (white background, ~1200 px wide, readable fonts).
Calibration, acceptance and the tuned budget are here; the draft tree's drawing is analysis.tree_plot."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from .tables import (
    CalibrationBy,
    accept_length_table,
    calibration_table,
    depth_rank_table,
    mode_order,
    static_position_table,
    table_ece,
)

WIDTH = 1200
FONT = dict(family="Liberation Sans, Arial, Helvetica, sans-serif", size=18, color="#222")
PALETTE = qualitative.D3
ACCEPT_COLOR = "#d62728"
CONF_SCALE = "Viridis"


def paper_layout(fig: go.Figure, title: str, height: int = 700, width: int = WIDTH) -> go.Figure:
    """The shared look: white template, large fonts, fixed size (the export reads it from here)."""
    fig.update_layout(template="plotly_white", title=dict(text=title, x=0.5, xanchor="center"),
                      font=FONT, width=width, height=height, paper_bgcolor="white",
                      plot_bgcolor="white", margin=dict(l=90, r=40, t=90, b=80))
    return fig


def _empty(title: str, why: str, height: int = 500) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=20, color="#666"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return paper_layout(fig, title, height)


def _marker_sizes(counts: pd.Series) -> np.ndarray:
    """Marker area grows with the bin's count (sqrt), between 8 and 34 px across."""
    root = np.sqrt(counts.to_numpy(dtype=float))
    return 8 + 26 * root / max(root.max(initial=0.0), 1.0)  # no bins (all below the minimum): no sizes


# ---- reliability ----------------------------------------------------------------------------------
def reliability_figure(nodes: pd.DataFrame, by: CalibrationBy = "confidence", bins: int = 10,
                       per_depth: bool = False, min_count: int = 1) -> go.Figure:
    """Reliability diagram: acceptance rate against mean prediction per bin with its 95 % Wilson
    interval, the diagonal, marker size and a bar panel for the bin counts, the ECE in the title;
    bins with fewer than min_count nodes are hollow grey markers, left out of the curve and the ECE;
    per_depth adds one curve per depth. An empty bin is absent; a rate of 0 is a point at 0."""
    table = calibration_table(nodes, by, bins, min_count=min_count)
    what = "draft confidence (given parent accepted)" if by == "confidence" else "path value"
    if table.empty:
        return _empty(f"Reliability of the {what}", "no verified nodes to measure")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25],
                        vertical_spacing=0.04)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                             line=dict(color="#999", dash="dash")), row=1, col=1)
    enough, few = table[table["enough"]], table[~table["enough"]]
    fig.add_trace(_reliability_curve(enough, "all depths (95 % Wilson interval)", "#222"), row=1, col=1)
    if not few.empty:
        fig.add_trace(go.Scatter(x=few["mean_pred"], y=few["rate"], mode="markers",
                                 name=f"fewer than {min_count} nodes (not in ECE)",
                                 marker=dict(symbol="circle-open", size=10, color="#999"),
                                 customdata=few[["count"]], hovertemplate="n = %{customdata[0]}<extra></extra>"),
                      row=1, col=1)
    if per_depth:
        by_depth = calibration_table(nodes, by, bins, per_depth=True, min_count=min_count)
        for i, (depth, t) in enumerate(by_depth.groupby("depth")):
            name = f"depth {depth} (ECE {table_ece(t):.3f})"
            fig.add_trace(_reliability_curve(t[t["enough"]], name, PALETTE[i % len(PALETTE)], dash="dot",
                                             bars=False), row=1, col=1)
    centers = (table["lo"] + table["hi"]) / 2
    fig.add_trace(go.Bar(x=centers, y=table["count"], width=1 / bins * 0.9, name="nodes per bin",
                         marker_color=np.where(table["enough"], "#8c9fb8", "#d0d0d0"), showlegend=False),
                  row=2, col=1)
    fig.update_xaxes(range=[0, 1], row=1, col=1)
    fig.update_xaxes(range=[0, 1], title_text=f"predicted ({by})", row=2, col=1)
    fig.update_yaxes(range=[-0.02, 1.02], title_text="empirical acceptance", row=1, col=1)
    fig.update_yaxes(title_text="count", row=2, col=1)
    floor = f", bins of at least {min_count} nodes" if min_count > 1 else ""
    ece = table_ece(table)
    score = f"ECE = {ece:.3f}" if ece == ece else f"ECE n/a: no bin holds {min_count} nodes"
    title = (f"Reliability of the {what}<br><sup>{score} over "
             f"{int(enough['count'].sum())} nodes, {bins} bins{floor}</sup>")
    fig = paper_layout(fig, title, height=850)
    fig.update_layout(legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return fig


def _reliability_curve(table: pd.DataFrame, name: str, color: str, dash: str = "solid",
                       bars: bool = True) -> go.Scatter:
    error = dict(type="data", array=table["ci_hi"] - table["rate"], arrayminus=table["rate"] - table["ci_lo"],
                 color=color, thickness=1.2, width=4, visible=bars)
    return go.Scatter(x=table["mean_pred"], y=table["rate"], mode="lines+markers", name=name,
                      line=dict(color=color, dash=dash, width=2), error_y=error,
                      marker=dict(size=_marker_sizes(table["count"]), color=color),
                      customdata=table[["count", "lo", "hi", "ci_lo", "ci_hi"]],
                      hovertemplate="bin [%{customdata[1]:.2f}, %{customdata[2]:.2f})<br>"
                                    "predicted %{x:.3f}<br>accepted %{y:.3f} "
                                    "(95 %: %{customdata[3]:.3f}-%{customdata[4]:.3f})<br>n = %{customdata[0]}"
                                    "<extra></extra>")


# ---- per-position acceptance ----------------------------------------------------------------------
def depth_rank_heatmap(nodes: pd.DataFrame) -> go.Figure:
    """Acceptance rate given the parent was accepted, per depth (rows) x sibling rank (columns)."""
    title = "Acceptance given parent accepted, by depth and sibling rank"
    table = depth_rank_table(nodes)
    if table.empty:
        return _empty(title, "no verified nodes with an accepted parent")
    rate = table.pivot(index="depth", columns="rank", values="rate")
    count = table.pivot(index="depth", columns="rank", values="count")
    text = [[("" if math.isnan(r) else f"{r:.2f}<br>n={int(c)}") for r, c in zip(rr, cc)]
            for rr, cc in zip(rate.to_numpy(dtype=float), count.to_numpy(dtype=float))]
    fig = go.Figure(go.Heatmap(z=rate.to_numpy(dtype=float), x=[str(c) for c in rate.columns],
                               y=[str(d) for d in rate.index], text=text, texttemplate="%{text}",
                               textfont=dict(size=14), colorscale="Blues", zmin=0, zmax=1,
                               colorbar=dict(title="rate"), xgap=2, ygap=2,
                               hovertemplate="depth %{y}, rank %{x}: %{z:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="sibling rank (0 = draft's best)", type="category")
    fig.update_yaxes(title_text="depth (1 = the root's children)", type="category", autorange="reversed")
    fig = paper_layout(fig, f"{title}<br><sup>grey: no node at that depth and rank (a rate of 0 is white)</sup>",
                       height=max(450, 110 + 80 * len(rate.index)))
    return fig.update_layout(plot_bgcolor="#d9d9d9")


MIN_PROMPTS_FOR_SPREAD = 5  # fewer prompts than this: no quartile ticks (two points have no spread)


def static_position_figure(nodes: pd.DataFrame, mode: str | None = "static", min_count: int = 1) -> go.Figure:
    """Acceptance of each tree position: the pooled rate with its 95 % Wilson interval, a dot on
    every bar (a rate of 0 is a dot on the axis; a position with no node has neither), the quartiles
    over prompts as ticks when there are at least MIN_PROMPTS_FOR_SPREAD prompts; positions with
    fewer than min_count nodes are left out (said in the subtitle)."""
    what = "Static tree: acceptance" if mode == "static" else "Acceptance"
    title = f"{what} per position (given parent accepted)"
    full = static_position_table(nodes, mode)
    table = full[full["count"] >= min_count]
    if table.empty:
        why = (f"no position has {min_count} or more nodes" if not full.empty
               else f"no {'static-tree ' if mode == 'static' else ''}rounds in these traces")
        return _empty(title, why)
    spread = int(table["traces"].max()) >= MIN_PROMPTS_FOR_SPREAD
    fig = go.Figure()
    for i, (depth, t) in enumerate(table.groupby("depth", sort=True)):
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Bar(x=t["position"], y=t["rate"], name=f"depth {depth}", marker_color=color,
                             error_y=dict(type="data", array=t["ci_hi"] - t["rate"],
                                          arrayminus=t["rate"] - t["ci_lo"], color="#333"),
                             customdata=t[["ci_lo", "ci_hi", "traces", "count"]],
                             hovertemplate="%{x}: %{y:.3f} (95 %: %{customdata[0]:.3f}-%{customdata[1]:.3f})<br>"
                                           "%{customdata[2]} prompts, %{customdata[3]} nodes<extra></extra>"))
        # n above every bar, on a dot: a 1.0 from one node must not read like a certainty, and a 0
        # must not read like a missing position.
        fig.add_trace(go.Scatter(x=t["position"], y=t["rate"], mode="markers+text", showlegend=False,
                                 text=[f"n={c}" for c in t["count"]], textposition="top center",
                                 textfont=dict(size=10), marker=dict(size=7, color="#333"), hoverinfo="skip"))
        for q in ("q25", "q75") if spread else ():
            fig.add_trace(go.Scatter(x=t["position"], y=t[q], mode="markers", showlegend=False,
                                     marker=dict(symbol="line-ew-open", size=14, color="#333"),
                                     hoverinfo="skip"))
    fig.update_xaxes(title_text="position (sibling ranks from the root)", type="category", tickangle=-60,
                     tickfont=dict(size=12))
    fig.update_yaxes(title_text="acceptance rate", range=[-0.02, 1.12])
    n = int(table["traces"].max())
    note = (f"bars: pooled rate over {n} prompt(s); whiskers: 95 % Wilson interval"
            + ("; ticks: quartiles over prompts" if spread else "")
            + (f"; {len(full) - len(table)} position(s) with fewer than {min_count} nodes left out"
               if len(full) > len(table) else ""))
    return paper_layout(fig, f"{title}<br><sup>{note}</sup>", height=650)


def accept_length_figure(steps: pd.DataFrame) -> go.Figure:
    """Histogram (fraction of rounds) of accept_length = accepted drafts + bonus, one bar per mode."""
    title = "Tokens per round (accepted drafts + bonus)"
    table = accept_length_table(steps)
    if table.empty:
        return _empty(title, "no decoding rounds")
    fig = go.Figure()
    for i, mode in enumerate(mode_order(table["mode"])):
        t = table[table["mode"] == mode]
        mean = float((t["accept_length"] * t["count"]).sum() / t["count"].sum())
        fig.add_trace(go.Bar(x=t["accept_length"], y=t["fraction"], name=f"{mode} (mean {mean:.2f})",
                             marker_color=PALETTE[i % len(PALETTE)], customdata=t["count"],
                             hovertemplate="%{x} tokens: %{y:.3f} (%{customdata} rounds)<extra></extra>"))
    fig.update_layout(barmode="group", legend=dict(x=0.98, xanchor="right", y=0.98))
    fig.update_xaxes(title_text="tokens committed in the round", dtick=1)
    fig.update_yaxes(title_text="fraction of rounds")
    return paper_layout(fig, title, height=600)


# ---- the hardware-tuned budget --------------------------------------------------------------------
def budget_figure(report: dict) -> go.Figure:
    """Why `--budget auto` chose its tree: for the chosen depth/top_k/vocabulary, expected tokens per
    round (tau) and the measured round cost against the tree size (top), and their ratio, expected
    tokens/s, against vanilla decoding (bottom). `report` is an auto report in its JSON form
    (eagle.tools.budget.report.AutoReport.to_json, as `budget --json` prints and bench's summary.json holds it)."""
    title = "Auto budget: expected τ against measured cost"
    curve = pd.DataFrame(report.get("curve", []))
    if curve.empty:
        return _empty(title, "no budget curve in this report")
    chosen = report["chosen"]
    vocab = chosen["draft_vocab"] or "full"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        specs=[[{"secondary_y": True}], [{}]])
    fig.add_trace(go.Scatter(x=curve["total_tokens"], y=curve["accept_length"], name="expected τ",
                             mode="lines+markers", line=dict(color=PALETTE[0], width=3)), row=1, col=1)
    fig.add_trace(go.Scatter(x=curve["total_tokens"], y=curve["round_s"] * 1000, name="round cost (ms)",
                             mode="lines+markers", line=dict(color=PALETTE[1], width=3, dash="dash")),
                  row=1, col=1, secondary_y=True)
    fig.add_trace(go.Scatter(x=curve["total_tokens"], y=curve["tokens_per_s"], name="expected tokens/s",
                             mode="lines+markers", line=dict(color=PALETTE[2], width=3)), row=2, col=1)
    best = curve.loc[curve["tokens_per_s"].idxmax()]
    fig.add_trace(go.Scatter(x=[best["total_tokens"]], y=[best["tokens_per_s"]], name="chosen",
                             mode="markers", marker=dict(symbol="star", size=22, color=ACCEPT_COLOR)),
                  row=2, col=1)
    fig.add_hline(y=report["vanilla_tokens_per_s"], line=dict(color="#666", dash="dot"), row=2, col=1,
                  annotation_text="vanilla", annotation_position="bottom right")
    fig.update_xaxes(title_text="tree size (verified tokens per round)", row=2, col=1)
    fig.update_yaxes(title_text="τ", row=1, col=1)
    fig.update_yaxes(title_text="ms per round", row=1, col=1, secondary_y=True, showgrid=False, tickformat=".0f")
    fig.update_yaxes(title_text="tokens/s", row=2, col=1)
    fig.update_layout(legend=dict(orientation="h", y=-0.14))
    # Depth as everywhere else: a node's level below the root; the config's depth counts expansions.
    subtitle = (f"tree depth {chosen['depth'] + 1} (--depth {chosen['depth']}), top-k {chosen['top_k']}, "
                f"draft vocabulary {vocab}")
    return paper_layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=800)
