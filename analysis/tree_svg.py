"""One round's draft tree as a plain SVG string: the Live page's view while the decoder streams.

On a 2-core machine the browser shares the decoder's cores, and every redraw of the plotly tree costs
it about 30 ms to build and validate the figure in Python plus about 80 ms of plotly layout in the
browser (measured, scripts/bench_live.py). A static SVG of the same tree is a string built in about a
millisecond that the browser paints without a layout engine. It draws from the same TreeParts as
tree_figure: the same layout, colours, labels and title; no hover or zoom (the finished view is the
plotly chart)."""
from __future__ import annotations

import html

from plotly.colors import sample_colorscale

from eagle.records.trace import StepRecord

from .figures import ACCEPT_COLOR, CONF_SCALE
from .tree_plot import TreeParts, tree_parts
from .labels import GAP, Geometry, place_labels

COL_W, ROW_H = 150, 24  # px per tree level and per row at full size
PAD_X, PAD_TOP, PAD_BOTTOM = 16, 58, 34  # room for the title above and the legend below
LABEL_ROOM = 130  # past the deepest level, for its labels
MIN_WIDTH = 720  # room for the title and subtitle
FADED = 0.25  # opacity of reranked-away nodes, as in tree_figure
ROOT_FILL = sample_colorscale(CONF_SCALE, [1.0])[0]  # tree_figure colours the root as confidence 1
ACCEPTED_RING = f'stroke="{ACCEPT_COLOR}" stroke-width="3"'
CSS_CLASS = "eagle-live-tree"  # the page and the browser test find the streamed tree by it


def tree_svg(step: StepRecord, max_height: int = 640, label_limit: int = 12) -> str:
    """The tree of `step` (reranked-away nodes left out, as in the finished view's default); a tree
    taller than max_height pixels gets shorter rows and smaller labels (not a scaled-down drawing), so
    its legend stays in view and its levels keep their spacing; labels that would then touch are left
    out (analysis.labels), never drawn over each other."""
    parts = tree_parts(step)
    row_h = min(ROW_H, (max_height - PAD_TOP - PAD_BOTTOM) / max(1, parts.rows - 1))
    font, radius = max(8.0, min(13.0, 0.6 * row_h)), max(2.0, min(6.5, 0.4 * row_h))
    xy = {i: (PAD_X + level * COL_W, PAD_TOP + row * row_h) for i, (level, row) in parts.pos.items()}
    width = max(MIN_WIDTH, 2 * PAD_X + (parts.levels - 1) * COL_W + LABEL_ROOM)
    height = round(PAD_TOP + (parts.rows - 1) * row_h + PAD_BOTTOM)
    labels = place_labels(parts.nodes + [parts.bonus], parts.pos, parts.accepted, parts.bonus.id,
                          Geometry(COL_W, row_h, font, LABEL_ROOM), label_limit)
    body = [*_edges(parts, xy), *_nodes(parts, xy, radius, labels), _bonus(parts, xy, radius, labels),
            *_header(parts, height)]
    return (f'<svg class="{CSS_CLASS}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" font-family="Liberation Sans, Arial, sans-serif" font-size="{font:.1f}">{"".join(body)}</svg>')


def _edges(parts: TreeParts, xy: dict[int, tuple[float, float]]) -> list[str]:
    out = []
    for pairs, color, width in ((parts.edges, "#bbb", 1.2), (parts.path_edges, ACCEPT_COLOR, 4)):
        for a, b in pairs:
            if a in xy and b in xy:
                (x1, y1), (x2, y2) = xy[a], xy[b]
                out.append(f'<line x1="{x1}" y1="{y1:.1f}" x2="{x2}" y2="{y2:.1f}" stroke="{color}" '
                           f'stroke-width="{width}"/>')
    return out


def _nodes(parts: TreeParts, xy: dict[int, tuple[float, float]], r: float,
           labels: dict[int, tuple[str, str]]) -> list[str]:
    drafted = [n for n in parts.nodes if n.parent >= 0]
    colors = dict(zip((n.id for n in drafted),
                      sample_colorscale(CONF_SCALE, [min(1.0, max(0.0, n.confidence)) for n in drafted])))
    out = []
    for n in parts.nodes:
        x, y = xy[n.id]
        opacity = 1.0 if n.kept else FADED
        ring = ACCEPTED_RING if n.id in parts.accepted else 'stroke="#555" stroke-width="0.5"'
        if n.parent < 0:  # the root: the token the target already produced, drawn as a square
            out.append(f'<rect x="{x - r - 1.5:.1f}" y="{y - r - 1.5:.1f}" width="{2 * r + 3:.1f}" '
                       f'height="{2 * r + 3:.1f}" fill="{ROOT_FILL}" {ring}/>')
        else:
            out.append(f'<circle cx="{x}" cy="{y:.1f}" r="{r:.1f}" fill="{colors[n.id]}" opacity="{opacity}" {ring}/>')
        if n.id in labels:
            out.append(f'<text x="{x + GAP:.1f}" y="{y:.1f}" dominant-baseline="central" fill="#222" '
                       f'opacity="{opacity}">{"".join(labels[n.id])}</text>')
    return out


def _bonus(parts: TreeParts, xy: dict[int, tuple[float, float]], r: float,
           labels: dict[int, tuple[str, str]]) -> str:
    x, y = xy[parts.bonus.id]
    diamond = (f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" fill="white" '
               f'stroke="{ACCEPT_COLOR}" stroke-width="3" transform="rotate(45 {x} {y:.1f})"/>')
    if parts.bonus.id not in labels:
        return diamond
    token, suffix = labels[parts.bonus.id]
    return (diamond + f'<text x="{x + GAP:.1f}" y="{y:.1f}" dominant-baseline="central" fill="{ACCEPT_COLOR}">'
            f'<tspan font-weight="bold">{token}</tspan>{suffix}</text>')


def _header(parts: TreeParts, height: int) -> list[str]:
    """Title and subtitle above, a one-line legend below (inside the drawing, so scaling keeps it)."""
    y = height - 12
    legend = [f'<line x1="{x}" y1="{y - 4}" x2="{x + 24}" y2="{y - 4}" stroke="{color}" stroke-width="{w}"/>'
              f'<text x="{x + 30}" y="{y}" font-size="12" fill="#222">{name}</text>'
              for x, color, w, name in ((PAD_X, ACCEPT_COLOR, 4, "accepted path"),
                                        (PAD_X + 130, "#bbb", 1.2, "draft edge"))]
    return [f'<text x="{PAD_X}" y="20" font-size="16" fill="#222">{html.escape(parts.title)}</text>',
            f'<text x="{PAD_X}" y="38" font-size="12" fill="#555">{html.escape(parts.subtitle)}; '
            'circles coloured by draft confidence (dark 0, yellow 1); diamond = bonus</text>', *legend]
