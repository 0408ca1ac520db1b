"""Download buttons for traces (JSONL, Parquet) and figures (PNG when kaleido has a browser, else
HTML). Heavy conversions are deferred: Streamlit calls the data callable only on click."""
from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Callable

import plotly.graph_objects as go
import streamlit as st

from analysis.export import INSTALL_HINT, find_browser, write_figures
from analysis.tables import nodes_frame
from eagle.trace import Trace, write_trace


def traces_jsonl(traces: list[Trace]) -> bytes:
    """The traces in the project's JSONL format, written by eagle.trace itself."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.jsonl"
        write_trace(path, traces)
        return path.read_bytes()


def nodes_parquet(traces: list[Trace]) -> bytes:
    """One row per drafted node (analysis.tables.nodes_frame) as Parquet."""
    buf = io.BytesIO()
    nodes_frame(traces).to_parquet(buf, index=False)
    return buf.getvalue()


def png_bytes(fig: go.Figure) -> bytes:
    """The figure at its paper size (x2) through analysis.export, i.e. kaleido + a local Chromium."""
    with tempfile.TemporaryDirectory() as tmp:
        result = write_figures({"figure": fig}, tmp, ("png",), scale=2)
        png = Path(tmp) / "figure.png"
        if not png.is_file():
            raise RuntimeError("; ".join(result.messages) or "no PNG was written")
        return png.read_bytes()


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


def figure_download(fig: go.Figure, key: str, stem: str) -> None:
    """PNG when possible, otherwise a self-contained HTML file, with the reason shown."""
    if find_browser() is not None:
        st.download_button("Figure (PNG)", _deferred(lambda: png_bytes(fig)),
                           f"{stem}.png", "image/png", key=f"{key}_png", on_click="ignore")
        return
    st.download_button("Figure (HTML)", _deferred(lambda: fig.to_html(include_plotlyjs=True).encode()),
                       f"{stem}.html", "text/html", key=f"{key}_html", on_click="ignore")
    st.caption(f"PNG unavailable: {INSTALL_HINT}. Offering interactive HTML instead.")
