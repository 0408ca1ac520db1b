"""A private draft-tree figure for the live page, used until analysis/ provides `tree_figure`.

Layout: x = depth, y = leaf order of a depth-first walk (children in rank order), so siblings sit
together and the accepted path reads left to right."""
from __future__ import annotations

import plotly.graph_objects as go

from eagle.trace import NodeRecord, StepRecord


def _layout(nodes: list[NodeRecord]) -> dict[int, tuple[float, float]]:
    children: dict[int, list[NodeRecord]] = {}
    for n in nodes:
        children.setdefault(n.parent, []).append(n)
    pos: dict[int, tuple[float, float]] = {}
    next_leaf = [0.0]

    def place(node: NodeRecord) -> float:  # recursion depth = tree depth (<= 32 by config)
        kids = sorted(children.get(node.id, []), key=lambda k: k.rank)
        if kids:
            y = sum(place(k) for k in kids) / len(kids)
        else:
            y, next_leaf[0] = next_leaf[0], next_leaf[0] + 1
        pos[node.id] = (float(node.depth), -y)
        return y

    for root in children.get(-1, []):
        place(root)
    return pos


def _edges(nodes: list[NodeRecord], pos: dict, accepted: set[int]) -> list[go.Scatter]:
    traces = []
    for on_path in (False, True):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for n in nodes:
            if n.parent in pos and (n.id in accepted) == on_path:
                xs += [pos[n.parent][0], pos[n.id][0], None]
                ys += [pos[n.parent][1], pos[n.id][1], None]
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line=dict(color="#2ca02c" if on_path else "#c8c8c8",
                                           width=4 if on_path else 1)))
    return traces


def _nodes_trace(nodes: list[NodeRecord], pos: dict, accepted: set[int]) -> go.Scatter:
    # Label only verified nodes: the reranked-away ones would bury the tree in text.
    label = [f"{n.text!r} {n.confidence:.2f}" if n.kept else "" for n in nodes]
    hover = [f"id {n.id} · depth {n.depth} · rank {n.rank}<br>token {n.text!r} ({n.token})<br>"
             f"confidence {n.confidence:.3f} · value {n.value:.3g}<br>"
             f"{'accepted' if n.accepted else 'verified' if n.kept else 'reranked away'}"
             + (f"<br>target p {n.target_prob:.3f}" if n.target_prob is not None else "") for n in nodes]
    return go.Scatter(
        x=[pos[n.id][0] for n in nodes], y=[pos[n.id][1] for n in nodes], mode="markers+text",
        text=label, textposition="middle right", hovertext=hover, hoverinfo="text", showlegend=False,
        textfont=dict(size=10),
        marker=dict(size=[16 if n.id in accepted else 11 for n in nodes],
                    color=[n.confidence for n in nodes], colorscale="Viridis", cmin=0, cmax=1,
                    opacity=[1.0 if n.kept else 0.25 for n in nodes],
                    line=dict(color=["#2ca02c" if n.id in accepted else "#555" for n in nodes],
                              width=[3 if n.id in accepted else 0.5 for n in nodes]),
                    colorbar=dict(title="draft<br>confidence", thickness=12)))


def _bonus_trace(step: StepRecord, pos: dict) -> go.Scatter:
    last = pos[step.accepted[-1]] if step.accepted and step.accepted[-1] in pos else (0.0, 0.0)
    return go.Scatter(x=[last[0] + 1], y=[last[1]], mode="markers+text", showlegend=False,
                      text=[f"bonus {step.bonus_text!r}"], textposition="middle right",
                      hovertext=[f"bonus token from the target: {step.bonus_text!r}"], hoverinfo="text",
                      marker=dict(symbol="star", size=18, color="#ff7f0e", line=dict(color="#333", width=1)))


def tree_figure(step: StepRecord, height: int = 420) -> go.Figure:
    """Nodes coloured by confidence, reranked-away nodes faded, accepted path thick green, bonus star."""
    nodes = step.nodes
    pos = _layout(nodes)
    accepted = set(step.accepted)
    fig = go.Figure([*_edges(nodes, pos, accepted), _nodes_trace(nodes, pos, accepted),
                     _bonus_trace(step, pos)])
    title = (f"Round {step.step}: prefill (no draft)" if not nodes else
             f"Round {step.step}: {len(step.accepted) - 1} of {sum(n.kept for n in nodes) - 1} "
             f"verified drafts accepted + bonus")
    fig.update_layout(title=title, height=height, margin=dict(l=10, r=10, t=40, b=30),
                      xaxis=dict(title="depth", dtick=1, zeroline=False),
                      yaxis=dict(visible=False), plot_bgcolor="white")
    return fig
