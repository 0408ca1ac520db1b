"""Tree budget: which tree `auto` chose on this machine, and why (expected τ against measured cost)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.figures import budget_figure
from app import exports, render, state
from eagle.tools.budget.report import AutoReport

COLUMNS = ["total_tokens", "depth", "top_k", "draft_vocab", "accept_length", "round_s", "tokens_per_s", "speedup"]


def show_choice(report: AutoReport) -> None:
    c1, c2, c3 = st.columns(3)
    chosen = report.chosen
    # The full label does not fit a metric tile: the tile holds the size, the caption the rest.
    c1.metric("Chosen tree", f"{chosen['total_tokens']} tokens", help=state.budget_label(chosen))
    c1.caption(state.budget_label(chosen))
    c2.metric("Expected speedup over vanilla", f"{report.expected_speedup:.2f}x",
              help=f"Expected tokens per round / measured round cost, against {report.vanilla_label} "
                   f"({report.expected_speedup_same_dtype:.2f}x vanilla at the model's own dtype)")
    c3.metric("Expected τ (tokens per round)", f"{report.expected_accept_length:.2f}",
              help=f"Replayed from {report.calibration_rounds} recorded calibration rounds")
    if not report.beats_vanilla:
        st.warning("No tree budget is expected to beat plain decoding on this machine with this head: "
                   "verifying several tokens costs more than the draft saves.")


def show_tables(report: AutoReport) -> None:
    st.subheader("Best budget per draft vocabulary")
    st.dataframe(pd.DataFrame(report.best_per_vocab)[COLUMNS], hide_index=True, key="budget_vocab")
    st.subheader("Measured verify cost")
    costs = pd.DataFrame({"tokens": [int(n) for n in report.t_verify],
                          "ms": [1000 * t for t in report.t_verify.values()]})
    st.dataframe(costs, hide_index=True, key="budget_costs")
    st.caption(f"Cost cache: {state.short_path(report.costs_file)} · report: {state.short_path(report.auto_file)}")


def main() -> None:
    st.title("Tree budget")
    st.caption("`--budget auto` picks the tree size, depth, top-k and draft vocabulary with the most "
               "expected tokens/s: expected accepted length (replayed from recorded draft trees) over the "
               "round cost measured on this machine.")
    models = state.get_models(state.dtype_choice())
    state.show_head_badge(models)
    refresh = st.button("Measure this machine again", key="budget_refresh",
                        help="Re-time the verify and draft passes and recalibrate (a few minutes on two cores)")
    report = state.auto_budget(models, refresh=refresh)
    show_choice(report)
    fig = budget_figure(report.to_json())
    render.show_figure(fig, key="budget_fig")
    exports.figure_download(fig, key="budget_fig_dl", stem="auto_budget")
    show_tables(report)


main()
