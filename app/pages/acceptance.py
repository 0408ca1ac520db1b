"""Acceptance by position: where in the draft tree do accepted tokens come from, and how much does
that vary from prompt to prompt?"""
from __future__ import annotations

import streamlit as st

from analysis.figures import MIN_PROMPTS_FOR_SPREAD, depth_rank_heatmap, static_position_figure
from analysis.tables import depth_rank_table, nodes_frame, static_position_table
from app import exports, render
from app.sources import chosen_traces


def main() -> None:
    st.title("Acceptance by position")
    st.caption("Acceptance rate of verified nodes whose parent was accepted (the ones that had a chance).")
    traces = chosen_traces("acc")
    if not traces:
        return
    nodes = nodes_frame(traces)
    heat = depth_rank_heatmap(nodes)
    render.show_figure(heat, key="acc_heat")
    exports.figure_download(heat, key="acc_heat_dl", stem="depth_rank_heatmap")
    st.subheader("Per-position acceptance")
    st.caption("Each position is the sibling-rank path from the root (\"0-1\" = best child, then its "
               "second child); bars are the pooled rate with its 95 % Wilson interval, quartile ticks the "
               f"spread over prompts once there are {MIN_PROMPTS_FOR_SPREAD} or more.")
    min_count = st.number_input("Minimum nodes per position", 1, 10_000, 5, key="acc_min_count",
                                help="Positions with fewer nodes are left out of the chart")
    spread = static_position_figure(nodes, mode=None, min_count=min_count)
    render.show_figure(spread, key="acc_spread")
    exports.figure_download(spread, key="acc_spread_dl", stem="position_spread")
    with st.expander("Tables"):
        st.dataframe(depth_rank_table(nodes), hide_index=True, key="acc_table_dr")
        st.dataframe(static_position_table(nodes, mode=None), hide_index=True, key="acc_table_pos")


main()
