"""Calibration: is the draft's confidence an honest acceptance probability? (EAGLE-2's premise.)"""
from __future__ import annotations

import streamlit as st

from analysis.figures import reliability_figure
from analysis.tables import calibration_table, nodes_frame, table_ece
from app import exports, render
from app.sources import chosen_traces

BY_HELP = ("confidence: the draft's probability of a token given its parent, judged on verified nodes "
           "whose parent was accepted. value: the path product EAGLE-2 reranks by, judged on all "
           "verified nodes.")
MIN_HELP = "Bins with fewer nodes are drawn hollow and left out of the curve and the ECE"


def main() -> None:
    st.title("Calibration")
    st.caption("Reliability diagram of the draft head: predicted acceptance against the rate observed, "
               "with 95 % Wilson intervals. An empty bin is left out; a rate of 0 is a point at 0.")
    traces = chosen_traces("cal")
    if not traces:
        return
    c1, c2, c3, c4 = st.columns(4)
    by = c1.radio("Prediction", ("confidence", "value"), horizontal=True, key="cal_by", help=BY_HELP)
    bins = c2.slider("Bins", 2, 20, 10, key="cal_bins")
    min_count = c3.number_input("Minimum nodes per bin", 1, 10_000, 10, key="cal_min_count", help=MIN_HELP)
    per_depth = c4.checkbox("Per-depth curves", key="cal_per_depth")
    nodes = nodes_frame(traces)
    ece = table_ece(calibration_table(nodes, by, bins, min_count=min_count))
    st.metric("ECE (expected calibration error)", "n/a" if ece != ece else f"{ece:.3f}",
              help="Count-weighted mean |acceptance rate - mean prediction| over the bins with enough nodes")
    fig = reliability_figure(nodes, by, bins, per_depth, min_count)
    render.show_figure(fig, key="cal_fig")
    with st.expander("Bin table"):
        st.dataframe(calibration_table(nodes, by, bins, per_depth=per_depth, min_count=min_count),
                     hide_index=True, key="cal_table")
    exports.figure_download(fig, key="cal_fig_dl", stem=f"reliability_{by}")
    exports.trace_downloads(traces, key="cal_traces", stem="calibration_traces")


main()
