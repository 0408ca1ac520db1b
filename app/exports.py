"""Download buttons for traces (JSONL, Parquet) and figures (PNG when kaleido has a browser, else
HTML). Heavy conversions are deferred: Streamlit calls the data callable only on click."""
from __future__ import annotations

import functools
import importlib.util
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import plotly.graph_objects as go
import streamlit as st

from analysis.tables import nodes_frame
from eagle.trace import Trace, write_trace

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


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


@functools.lru_cache(maxsize=1)
def png_unavailable() -> str | None:
    """Why PNG export cannot work here (None when it can): kaleido needs a Chrome/Chromium binary."""
    if importlib.util.find_spec("kaleido") is None:
        return "PNG export needs the kaleido package"
    if not (os.environ.get("BROWSER_PATH") or any(shutil.which(b) for b in BROWSERS)):
        return "PNG export needs Chrome or Chromium for kaleido (apt-get install chromium)"
    return None


def _deferred(make: Callable[[], bytes]) -> Callable[[], bytes]:
    """Run on click in another thread, where no message can be shown: a failure becomes the file."""
    def run() -> bytes:
        try:
            return make()
        except (OSError, RuntimeError, ValueError) as err:
            return f"Export failed: {err}\n".encode()
    return run


def trace_downloads(traces: list[Trace], key: str, stem: str = "traces") -> None:
    if not traces:
        return
    c1, c2 = st.columns(2)
    c1.download_button("Traces (JSONL)", _deferred(lambda: traces_jsonl(traces)), f"{stem}.jsonl",
                       "application/jsonl", key=f"{key}_jsonl", on_click="ignore")
    c2.download_button("Nodes (Parquet)", _deferred(lambda: nodes_parquet(traces)), f"{stem}_nodes.parquet",
                       "application/vnd.apache.parquet", key=f"{key}_parquet", on_click="ignore")


def figure_download(fig: go.Figure, key: str, stem: str) -> None:
    """PNG when possible, otherwise a self-contained HTML file, with the reason shown."""
    reason = png_unavailable()
    if reason is None:
        st.download_button("Figure (PNG)", _deferred(lambda: fig.to_image(format="png", scale=2)),
                           f"{stem}.png", "image/png", key=f"{key}_png", on_click="ignore")
        return
    st.download_button("Figure (HTML)", _deferred(lambda: fig.to_html(include_plotlyjs=True).encode()),
                       f"{stem}.html", "text/html", key=f"{key}_html", on_click="ignore")
    st.caption(f"{reason}; offering interactive HTML instead.")
