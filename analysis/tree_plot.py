"""The draft tree of one round as a plotly figure: a tidy layout (level x row), the accepted path, the
bonus token, confidence colours, pruned and prompt-lookup nodes, labels placed without overlap
(analysis.labels), and the helpers that pick which round to show."""
from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from eagle.records.trace import NodeRecord, StepRecord

from .figures import ACCEPT_COLOR, CONF_SCALE, WIDTH, paper_layout
from .labels import Geometry, place_labels, text_px, visible_text


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
