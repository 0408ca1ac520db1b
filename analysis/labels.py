"""Tree labels that never overlap: which node gets a label, and how much of its text fits.

A drawing of a draft tree places nodes on a grid (level x row, analysis.tree_plot.tree_layout) and writes
each label to the right of its node. Two labels overlap when they sit in the same level closer than a
line of text apart, or when a label runs into the next level. So, given the drawing's pixel geometry,
labels are placed greedily by importance (the bonus, the root, the accepted path, then by confidence):
a label whose line would touch one already placed in its level is left out (the node keeps its hover),
and every label is elided to its column's width. Widths are estimated from the character classes
(wide East Asian characters and emoji take a full em, others about 0.62 em in Liberation Sans)."""
from __future__ import annotations

import html
import unicodedata
from dataclasses import dataclass

from eagle.records.trace import NodeRecord

EM_NARROW, EM_WIDE = 0.62, 1.05  # average advance per character, in font sizes (bold digits included)
LINE = 1.2  # labels of one level need this many font sizes between their centres
GAP = 10.0  # px from a node's centre to its label's start (the marker's radius and a little air)


def visible_text(text: str) -> str:
    """A token's text made visible (spaces, newlines, tabs) and SVG-safe: other control characters
    become \\xNN (they are invalid in SVG and make the export fail). Not yet HTML-escaped."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) in ("Cc", "Cs", "Cn") else c for c in shown)


def text_px(text: str, font_px: float) -> float:
    """Estimated drawn width of `text` (an upper-leaning estimate: elision errs on the short side)."""
    wide = sum(1 for c in text if unicodedata.east_asian_width(c) in "WF" or ord(c) > 0xFFFF)
    return font_px * (EM_WIDE * wide + EM_NARROW * (len(text) - wide))


def elide(text: str, max_px: float, font_px: float) -> str:
    """`text`, cut with an ellipsis where it would pass max_px; "" when not even one character fits."""
    if text_px(text, font_px) <= max_px:
        return text
    while text and text_px(text + "…", font_px) > max_px:
        text = text[:-1]
    return text + "…" if text else ""


@dataclass(frozen=True)
class Geometry:
    """Pixels per tree level and per row, the label font, and the room right of the deepest level."""
    col_px: float
    row_px: float
    font_px: float
    last_room_px: float


def node_text(node: NodeRecord, limit: int) -> tuple[str, str]:
    """(token part, suffix) of a node's label: the token's visible text, at most `limit` characters,
    and its confidence (none for the root, "(bonus)" for the bonus token)."""
    token = visible_text(node.text)
    if len(token) > limit:
        token = token[: limit - 1] + "…"
    if node.parent < 0:
        return token, ""
    if node.confidence != node.confidence:  # NaN: the bonus token, which the draft did not propose
        return token, " (bonus)"
    return token, f" {node.confidence:.2f}"


def priority(node: NodeRecord, accepted: set[int], bonus_id: int) -> tuple:
    """Who gets a label first: the bonus, the root, the accepted path, kept nodes, by confidence."""
    return (node.id != bonus_id, node.parent >= 0, node.id not in accepted, not node.kept,
            -(node.confidence if node.confidence == node.confidence else 2.0), node.id)


def place_labels(nodes: list[NodeRecord], pos: dict[int, tuple[float, float]], accepted: set[int],
                 bonus_id: int, geo: Geometry, limit: int = 12) -> dict[int, tuple[str, str]]:
    """node id -> (token part, suffix), both HTML-escaped, for the nodes that get a label; the others
    get none. No two placed labels overlap under `geo`, and none runs into the next level."""
    last_level = max((x for x, _ in pos.values()), default=0)
    taken: dict[float, list[float]] = {}  # level -> the rows (px) of the labels placed there
    labels: dict[int, tuple[str, str]] = {}
    for node in sorted((n for n in nodes if n.id in pos), key=lambda n: priority(n, accepted, bonus_id)):
        level, row = pos[node.id]
        y = row * geo.row_px
        if any(abs(y - other) < LINE * geo.font_px for other in taken.get(level, ())):
            continue
        room = (geo.last_room_px if level == last_level else geo.col_px) - GAP - 2
        token, suffix = node_text(node, limit)
        if text_px(token + suffix, geo.font_px) > room:  # drop the number before cutting the token
            suffix = suffix if suffix == " (bonus)" and text_px(suffix, geo.font_px) < room / 2 else ""
            token = elide(token, room - text_px(suffix, geo.font_px), geo.font_px)
        if not token:
            continue
        taken.setdefault(level, []).append(y)
        labels[node.id] = (html.escape(token, quote=False), html.escape(suffix, quote=False))
    return labels
