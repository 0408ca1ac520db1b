"""Download buttons for traces (JSONL, Parquet) and figures (PNG, SVG and PDF at paper sizes when
kaleido has a browser, else HTML). Heavy conversions are deferred: Streamlit calls the data callable
only on click."""
from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Callable

import plotly.graph_objects as go
import streamlit as st

from analysis.export import INSTALL_HINT, PAPER_WIDTHS, PaperSize, find_browser, write_figures
from analysis.tables import nodes_frame
from eagle.records.trace import Trace, write_trace


def traces_jsonl(traces: list[Trace]) -> bytes:
    """The traces in the project's JSONL format, written by eagle.records.trace itself."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.jsonl"
        write_trace(path, traces)
        return path.read_bytes()


def nodes_parquet(traces: list[Trace]) -> bytes:
    """One row per drafted node (analysis.tables.nodes_frame) as Parquet."""
    buf = io.BytesIO()
    nodes_frame(traces).to_parquet(buf, index=False)
    return buf.getvalue()


FIGURE_FORMATS = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf"}
AS_SHOWN = "as laid out (1200 px)"
Rebuild = Callable[[int], go.Figure]  # a figure whose layout depends on its width, built at that width


def figure_bytes(fig: go.Figure, fmt: str, paper: PaperSize | None = None) -> bytes:
    """The figure as PNG, SVG or PDF through analysis.export (kaleido + a local Chromium): at its layout
    size (PNG at 2x), or exactly paper.inches wide."""
    with tempfile.TemporaryDirectory() as tmp:
        result = write_figures({"figure": fig}, tmp, (fmt,), scale=2, paper=paper)
        path = Path(tmp) / f"figure.{fmt}"
        if not path.is_file():
            raise RuntimeError("; ".join(result.messages) or f"no {fmt.upper()} was written")
        return path.read_bytes()


def _deferred(make: Callable[[], bytes]) -> Callable[[], bytes]:
    """Run on click in another thread, where no message can be shown: a failure becomes the file."""
    def run() -> bytes:
        try:
            return make()
        except (OSError, RuntimeError, ValueError) as err:
            return f"Export failed: {err}\n".encode()
    return run


def trace_downloads(traces: list[Trace], key: str, stem: str = "traces", what: str = "") -> None:
    """JSONL and Parquet buttons; `what` ("this run", "all 3 runs") names them when a page has two pairs."""
    if not traces:
        return
    suffix = f": {what}" if what else ""
    c1, c2 = st.columns(2)
    c1.download_button(f"Traces (JSONL){suffix}", _deferred(lambda: traces_jsonl(traces)), f"{stem}.jsonl",
                       "application/jsonl", key=f"{key}_jsonl", on_click="ignore")
    c2.download_button(f"Nodes (Parquet){suffix}", _deferred(lambda: nodes_parquet(traces)), f"{stem}_nodes.parquet",
                       "application/vnd.apache.parquet", key=f"{key}_parquet", on_click="ignore")


def figure_download(fig: go.Figure, key: str, stem: str, rebuild: Rebuild | None = None) -> None:
    """A "Download figure" popover: a size (as laid out, or one or two paper columns) and PNG, SVG
    and PDF buttons; without a browser, a self-contained HTML file with the reason shown. `rebuild`
    lays the figure out afresh at a paper width (the tree elides its labels to its width)."""
    with st.popover("Download figure", icon=":material/download:"):
        if find_browser() is None:
            st.download_button("Figure (HTML)", _deferred(lambda: fig.to_html(include_plotlyjs=True).encode()),
                               f"{stem}.html", "text/html", key=f"{key}_html", on_click="ignore")
            st.caption(f"PNG, SVG and PDF unavailable: {INSTALL_HINT}. Offering interactive HTML instead.")
            return
        size = st.radio("Size", (AS_SHOWN, *PAPER_WIDTHS), key=f"{key}_size",
                        help="Paper sizes print the text at 9 pt; PDF embeds its fonts, SVG names them "
                             "(Liberation Sans, else Arial)")
        paper = PaperSize(PAPER_WIDTHS[size]) if size in PAPER_WIDTHS else None
        sized = rebuild(paper.layout_width) if paper and rebuild else fig
        suffix = f"_{paper.inches:g}in" if paper else ""
        for col, (fmt, mime) in zip(st.columns(3), FIGURE_FORMATS.items()):
            col.download_button(fmt.upper(), _deferred(lambda fmt=fmt: figure_bytes(sized, fmt, paper)),
                                f"{stem}{suffix}.{fmt}", mime, key=f"{key}_{fmt}", on_click="ignore")
