"""EAGLE-2 Explorer: `eagle2-explorer app` (or `streamlit run app/main.py`). The router; every page lives in
app/pages/. Its server settings are in app/.streamlit/config.toml."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

PAGES = Path(__file__).resolve().parent / "pages"
# A bundled file, served by this server: a material or emoji page icon makes the browser fetch the
# favicon from Google's or jsDelivr's CDN, which fails offline and leaks the visit.
ICON = Path(__file__).resolve().parent / "static" / "icon.png"


def main() -> None:
    st.set_page_config(page_title="EAGLE-2 Explorer", page_icon=str(ICON), layout="wide")
    nav = st.navigation([
        st.Page(PAGES / "live.py", title="Live explorer", icon=":material/bolt:", default=True),
        st.Page(PAGES / "calibration.py", title="Calibration", icon=":material/insights:"),
        st.Page(PAGES / "acceptance.py", title="Acceptance by position", icon=":material/grid_on:"),
        st.Page(PAGES / "compare.py", title="Static vs dynamic", icon=":material/compare:"),
        st.Page(PAGES / "budget.py", title="Tree budget", icon=":material/tune:"),
        st.Page(PAGES / "history.py", title="Run history", icon=":material/history:"),
    ])
    nav.run()


main()
