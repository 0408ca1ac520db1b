"""Acceptance by position: where in the draft tree do accepted tokens come from, and how much does
that vary from prompt to prompt?"""
from __future__ import annotations

import streamlit as st

from analysis.figures import depth_rank_heatmap, static_position_figure
from analysis.tables import depth_rank_table, nodes_frame, static_position_table
from app import exports, render
from app.sources import pick_traces

ALL_MODES = "all modes"


def main() -> None:
    st.title("Acceptance by position")
    st.caption("Acceptance rate of verified nodes whose parent was accepted (the ones that had a chance).")
    traces = pick_traces("acc")
    if not traces:
        return
    nodes = nodes_frame(traces)
    modes = sorted(nodes["mode"].unique()) if not nodes.empty else []
    choice = st.selectbox("Mode", [ALL_MODES, *modes], key="acc_mode")
    if choice != ALL_MODES:
        nodes = nodes[nodes["mode"] == choice]
    heat = depth_rank_heatmap(nodes)
    render.show_figure(heat, key="acc_heat")
    exports.figure_download(heat, key="acc_heat_dl", stem="depth_rank_heatmap")
    st.subheader("Per-position spread across prompts")
    st.caption("Each position is the sibling-rank path from the root (\"0-1\" = best child, then its "
               "second child); bars are the mean over traces, whiskers the spread between them.")
    spread = static_position_figure(nodes, mode=None)
    render.show_figure(spread, key="acc_spread")
    exports.figure_download(spread, key="acc_spread_dl", stem="position_spread")
    with st.expander("Tables"):
        st.dataframe(depth_rank_table(nodes), hide_index=True, key="acc_table_dr")
        st.dataframe(static_position_table(nodes, mode=None), hide_index=True, key="acc_table_pos")


main()
