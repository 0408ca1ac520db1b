"""Run history: every run of every session, kept on disk (app.history): search, name, open, delete."""
from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from app import history, render, state


def table(runs: list[history.Run]) -> pd.DataFrame:
    return pd.DataFrame({"name": [r.name for r in runs],
                         "when": [datetime.fromtimestamp(r.created).strftime("%Y-%m-%d %H:%M") for r in runs],
                         "mode": [r.mode for r in runs], "tokens": [r.tokens for r in runs],
                         "τ": [r.tau for r in runs], "prompt": [r.prompt[:80] for r in runs]})


def manage(store: history.RunStore, run: history.Run) -> None:
    """Rename, open (into this session's runs, for the analysis pages) or delete the chosen run."""
    st.caption("Prompt")
    st.code(run.prompt, language=None, wrap_lines=True)  # as typed: line breaks and emoji kept
    name = st.text_input("Name", value=run.name, key=f"hist_name_{run.id}")
    c1, c2, c3 = st.columns(3)
    if c1.button("Rename", key="hist_rename", icon=":material/edit:") and name != run.name:
        store.rename(run.id, name)
        st.rerun()
    if c2.button("Open in this session", key="hist_open", icon=":material/open_in_new:",
                 help="Adds it to this session's runs: the analysis pages and Compare can use it"):
        trace = store.load(run.id)
        state.add_trace(trace, keep=False)
        render.show_metrics(trace)
        render.show_tokens(trace)
        st.success("Opened: it is among this session's runs on the Calibration and Acceptance pages.")
    if c3.button("Delete", key="hist_delete", icon=":material/delete:"):
        store.delete(run.id)
        st.rerun()


def main() -> None:
    st.title("Run history")
    store = history.RunStore()
    st.caption(f"Every finished or stopped run, kept in {state.short_path(str(store.path))} across sessions "
               f"and restarts (set {history.ENV} to use another file).")
    search = st.text_input("Search names and prompts", key="hist_search")
    try:
        runs = store.runs(search)
    except history.HistoryError as err:
        st.error(str(err))
        return
    if not runs:
        st.info("No runs kept yet." if not search else "No run matches.")
        return
    st.dataframe(table(runs), hide_index=True, key="hist_table")
    chosen = st.selectbox("Run", range(len(runs)), format_func=lambda i: f"{runs[i].name} · {runs[i].id[:8]}",
                          key="hist_choice")
    try:
        manage(store, runs[chosen])
    except history.HistoryError as err:
        st.error(str(err))


main()
