"""Pure plotly figures for the paper and the dashboard: each function takes frames (or one step) and
returns a go.Figure laid out for static export (white background, ~1200 px wide, readable fonts)."""
from __future__ import annotations

import html
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative, sample_colorscale
from plotly.subplots import make_subplots

from eagle.records.trace import NodeRecord, StepRecord

from .labels import Geometry, place_labels, text_px, visible_text
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


# ---- the draft tree -------------------------------------------------------------------------------
def tree_layout(nodes: list[NodeRecord]) -> dict[int, tuple[float, float]]:
    """Tidy layout, networkx-free: x = level below the root, y = row. Leaves take successive rows in
    depth-first order with siblings by rank; a parent sits midway between its first and last child.
    Nodes not reachable from a root (a node whose parent is absent) get no position."""
    ids = {n.id for n in nodes}
    children: dict[int, list[NodeRecord]] = defaultdict(list)
    for n in nodes:
        if n.parent in ids and n.parent != n.id:
            children[n.parent].append(n)
    for kids in children.values():
        kids.sort(key=lambda n: (n.rank, n.id))
    pos: dict[int, tuple[float, float]] = {}
    seen: set[int] = set()
    next_row = 0
    stack = [(n, 0, False) for n in reversed([n for n in nodes if n.parent not in ids])]
    while stack:  # iterative post-order: children are placed before their parent
        node, level, expanded = stack.pop()
        if not expanded and node.id in seen:
            continue
        seen.add(node.id)
        if expanded:
            kids = [k for k in children[node.id] if k.id in pos]
        else:
            kids = [k for k in children[node.id] if k.id not in seen]
        if kids and not expanded:
            stack.append((node, level, True))
            stack.extend((k, level + 1, False) for k in reversed(kids))
        elif kids:
            pos[node.id] = (level, (pos[kids[0].id][1] + pos[kids[-1].id][1]) / 2)
        else:
            pos[node.id], next_row = (level, float(next_row)), next_row + 1
    return pos


def token_label(text: str, limit: int = 12) -> str:
    """A token's text made visible (spaces, newlines, tabs) and safe inside plotly's HTML labels.
    Other control characters become \\xNN: they are invalid in SVG and make the export fail."""
    shown = visible_text(text)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return html.escape(shown, quote=False)


def _bonus_node(step: StepRecord) -> NodeRecord:
    """The bonus token as an extra (last-ranked) child of the last accepted node, so the layout gives
    it its own row."""
    parent = step.accepted[-1] if step.accepted else -1
    depth = next((n.depth + 1 for n in step.nodes if n.id == parent), 0)
    return NodeRecord(id=max((n.id for n in step.nodes), default=0) + 1, parent=parent, depth=depth,
                      token=step.bonus_token, text=step.bonus_text, confidence=float("nan"),
                      value=float("nan"), rank=1 << 30, kept=True, accepted=True)


def _edge_xy(pairs: list[tuple[int, int]], pos: dict[int, tuple[float, float]]) -> tuple[list, list]:
    xs: list = []
    ys: list = []
    for a, b in pairs:
        if a in pos and b in pos:
            xs += [pos[a][0], pos[b][0], None]
            ys += [-pos[a][1], -pos[b][1], None]
    return xs, ys


@dataclass(frozen=True)
class TreeParts:
    """What every drawing of one round's tree needs: the placed nodes, their positions, the two kinds
    of edge and the title. tree_figure (plotly) and tree_svg (the live stream) both draw from it."""
    nodes: list[NodeRecord]  # drafted nodes with a position (pruned ones only if asked for)
    bonus: NodeRecord
    pos: dict[int, tuple[float, float]]  # id -> (level, row)
    edges: list[tuple[int, int]]  # (parent, child) off the accepted path
    path_edges: list[tuple[int, int]]  # the accepted path, bonus included
    accepted: set[int]
    title: str
    subtitle: str
    show_pruned: bool = False

    @property
    def rows(self) -> int:
        return 1 + int(max((y for _, y in self.pos.values()), default=0))

    @property
    def levels(self) -> int:
        return 1 + int(max((x for x, _ in self.pos.values()), default=0))


def tree_parts(step: StepRecord, show_pruned: bool = False) -> TreeParts:
    """Reranked-away nodes (kept=False) are left out unless `show_pruned`: they are most of a dynamic
    tree and crowd out the nodes the target actually verified."""
    nodes = [n for n in step.nodes if show_pruned or n.kept]
    bonus = _bonus_node(step)
    pos = tree_layout(nodes + [bonus])
    path = [i for i in step.accepted if i in pos] + [bonus.id]
    on_path = set(zip(path, path[1:]))
    edges = [(n.parent, n.id) for n in nodes if (n.parent, n.id) not in on_path]
    kept = sum(1 for n in step.nodes if n.kept and n.parent >= 0)
    drafted = sum(1 for n in step.nodes if n.parent >= 0)
    title = f"Round {step.step} ({step.mode}): {max(0, len(step.accepted) - 1)} draft token(s) accepted + bonus"
    pruned = (("faded = reranked away" if show_pruned else f"{drafted - kept} reranked away (hidden)")
              if drafted > kept else "none reranked away")
    return TreeParts([n for n in nodes if n.id in pos], bonus, pos, edges, sorted(on_path), set(step.accepted),
                     title, f"{kept} verified of {drafted} drafted; {pruned}", show_pruned)


def best_round(steps: list[StepRecord]) -> int:
    """Index of the most informative round to open a tree view on: the longest accepted path (the
    earliest of equals); the prefill (index 0) only when there is no other round."""
    rounds = [i for i, s in enumerate(steps) if s.step > 0]
    return max(rounds, key=lambda i: (len(steps[i].accepted), -i)) if rounds else 0


def round_at_position(steps: list[StepRecord], position: int) -> int:
    """Index of the round that generated token `position` (0 = the first new token, the prefill's);
    past the end, the last round. Lines up two runs of one prompt by what they had written."""
    end = 0
    for i, s in enumerate(steps):
        end += len(s.new_tokens)
        if position < end:
            return i
    return len(steps) - 1


def round_start(steps: list[StepRecord], index: int) -> int:
    """The generated position of round `index`'s first new token."""
    return sum(len(s.new_tokens) for s in steps[:index])


@dataclass(frozen=True)
class TreeCanvas:
    """A tree drawing's pixel frame: the figure size, its margins and the label font."""
    width: int
    height: int
    font_px: float
    top: int = 100
    bottom: int = 20
    side: int = 16

    def geometry(self, parts: TreeParts) -> tuple[Geometry, float]:
        """The label geometry and the x axis' left end (in levels): the root sits `side` px in."""
        plot_w, plot_h = self.width - 2 * self.side, self.height - self.top - self.bottom
        last_room = min(240.0, max(120.0, 0.22 * plot_w))
        col_px = (plot_w - last_room - 14) / max(1, parts.levels - 1)
        return Geometry(col_px, plot_h / parts.rows, self.font_px, last_room), 14 / col_px


LEGEND_FONT = 12


def _legend_rows(names: list[str], plot_w: float) -> int:
    """Rows a horizontal plotly legend of `names` needs (40 px of symbol and gap per entry)."""
    rows, used = 1, 0.0
    for name in names:
        w = 40 + text_px(name, LEGEND_FONT)
        if used and used + w > plot_w:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def tree_canvas(parts: TreeParts, width: int = WIDTH, max_height: int | None = None) -> TreeCanvas:
    """30 px a row at paper size; a taller tree on screen gets max_height and smaller labels (the ones
    that would then collide are left out, analysis.labels). The legend sits below the tree."""
    bottom = 18 + 22 * _legend_rows(_legend_names(parts), width - 32)
    natural = 100 + bottom + 30 * parts.rows
    height = max(360, natural if max_height is None else min(natural, max_height))
    return TreeCanvas(width, height, 13.0 if height == natural else 11.0, bottom=bottom)


def _legend_names(parts: TreeParts) -> list[str]:
    names = ["accepted path", "draft edge", "draft node, low confidence", "draft node, high confidence",
             "root (last committed token)", "bonus (target's token)"]
    names += ["prompt lookup (copied)"] if any(n.source == "lookup" for n in parts.nodes) else []
    return names + (["reranked away (faded)"] if parts.show_pruned else [])


def tree_figure(step: StepRecord, show_pruned: bool = False, label_limit: int = 12, width: int = WIDTH,
                max_height: int | None = None) -> go.Figure:
    """One round's draft tree, left to right: circles coloured by the draft's confidence, labelled with
    token text and confidence where a label fits without touching another (hover shows every node);
    reranked-away nodes (kept=False) faded, and only if asked for; the accepted path in red; the
    bonus token (the target's own next token) as a diamond at its end. `width` is the narrowest the
    figure will be drawn at (labels are elided to fit it); `max_height` caps a tall tree on screen."""
    parts = tree_parts(step, show_pruned)
    canvas = tree_canvas(parts, width, max_height)
    geo, left = canvas.geometry(parts)
    labels = place_labels(parts.nodes + [parts.bonus], parts.pos, parts.accepted, parts.bonus.id, geo, label_limit)
    fig = go.Figure()
    for pairs, color, w, name in ((parts.edges, "#bbb", 1.2, "draft edge"),
                                  (parts.path_edges, ACCEPT_COLOR, 4, "accepted path")):
        xs, ys = _edge_xy(pairs, parts.pos)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=w),
                                 name=name, hoverinfo="skip"))
    fig.add_trace(_tree_nodes(parts, labels, canvas.font_px))
    fig.add_trace(_bonus_trace(parts, labels, canvas.font_px))
    for trace in _legend_entries(parts):
        fig.add_trace(trace)
    fig.update_xaxes(visible=False, range=[-left, parts.levels - 1 + geo.last_room_px / geo.col_px])
    fig.update_yaxes(visible=False, range=[-parts.rows + 0.5, 0.5])
    fig = paper_layout(fig, f"{parts.title}<br><sup>{parts.subtitle}</sup>", canvas.height, canvas.width)
    # Exact margins (no autoexpand), so the label geometry above is the drawing's; the title starts
    # below plotly's toolbar and the legend sits in the bottom margin sized for it.
    fig.update_layout(margin=dict(l=canvas.side, r=canvas.side, t=canvas.top, b=canvas.bottom, autoexpand=False),
                      title=dict(x=0, xanchor="left", xref="paper", y=1 - 34 / canvas.height, yanchor="top",
                                 font_size=17),
                      legend=dict(orientation="h", x=0, y=-8 / (canvas.height - canvas.top - canvas.bottom),
                                  yanchor="top", font_size=LEGEND_FONT, itemclick=False, itemdoubleclick=False),
                      showlegend=True)
    return fig


def _tree_nodes(parts: TreeParts, labels: dict[int, tuple[str, str]], font_px: float) -> go.Scatter:
    nodes, pos, accepted = parts.nodes, parts.pos, parts.accepted
    root = [n.parent < 0 for n in nodes]
    faded = [0.25 if not n.kept else 1.0 for n in nodes]
    full = [token_label(n.text, 40) + ("" if r else f" {n.confidence:.2f}") for n, r in zip(nodes, root)]
    return go.Scatter(
        x=[pos[n.id][0] for n in nodes], y=[-pos[n.id][1] for n in nodes], mode="markers+text",
        text=["".join(labels.get(n.id, ("", ""))) for n in nodes], textposition="middle right",
        name="draft node", showlegend=False, cliponaxis=False,
        textfont=dict(size=font_px, color=[f"rgba(34,34,34,{a})" for a in faded]),
        marker=dict(size=[16 if r else 13 for r in root], symbol=[_node_symbol(n) for n in nodes],
                    color=[1.0 if r else n.confidence for n, r in zip(nodes, root)], colorscale=CONF_SCALE,
                    cmin=0, cmax=1, opacity=faded,
                    line=dict(width=[3 if n.id in accepted else 0.5 for n in nodes],
                              color=[ACCEPT_COLOR if n.id in accepted else "#555" for n in nodes])),
        customdata=[[n.id, n.rank, n.value, np.nan if n.target_prob is None else n.target_prob,
                     "prompt lookup" if n.source == "lookup" else "kept" if n.kept else "reranked away", f]
                    for n, f in zip(nodes, full)],
        hovertemplate="node %{customdata[0]} (rank %{customdata[1]}, %{customdata[4]})<br>%{customdata[5]}<br>"
                      "value %{customdata[2]:.3f}<br>target p %{customdata[3]:.3f}<extra></extra>")


def _node_symbol(node: NodeRecord) -> str:
    """A square root, a triangle for a node the prompt-lookup branch copied, circles for the head's."""
    return "square" if node.parent < 0 else "triangle-right" if node.source == "lookup" else "circle"


def _bonus_trace(parts: TreeParts, labels: dict[int, tuple[str, str]], font_px: float) -> go.Scatter:
    x, y = parts.pos[parts.bonus.id]
    token, suffix = labels.get(parts.bonus.id, ("", ""))
    return go.Scatter(x=[x], y=[-y], mode="markers+text", name="bonus (target's token)", cliponaxis=False,
                      text=[f"<b>{token}</b>{suffix}" if token else ""], textposition="middle right",
                      textfont=dict(size=font_px, color=ACCEPT_COLOR),
                      marker=dict(symbol="diamond", size=18, color="white",
                                  line=dict(width=3, color=ACCEPT_COLOR)),
                      hovertemplate=f"bonus token from the target: {token_label(parts.bonus.text, 40)}<extra></extra>")


def _legend_entries(parts: TreeParts) -> list[go.Scatter]:
    """Legend-only samples (no points): the node trace mixes a square root and circles of every
    confidence colour, so its own legend symbol would show whichever comes first."""
    low, high = sample_colorscale(CONF_SCALE, [0.1, 0.9])
    samples = [("draft node, low confidence", "circle", low, 1.0), ("draft node, high confidence", "circle", high, 1.0),
               ("root (last committed token)", "square", sample_colorscale(CONF_SCALE, [1.0])[0], 1.0)]
    if any(n.source == "lookup" for n in parts.nodes):
        samples.append(("prompt lookup (copied)", "triangle-right", high, 1.0))
    if parts.show_pruned:
        samples.append(("reranked away (faded)", "circle", "#888", 0.25))
    return [go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                       marker=dict(symbol=symbol, size=12, color=color, opacity=opacity,
                                   line=dict(width=0.5, color="#555")))
            for name, symbol, color, opacity in samples]


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
