"""Everything `python -m analysis figures` writes, as pure builders: traces -> named tables and
named figures (the dashboard can call the same functions)."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from eagle.records.trace import StepRecord, Trace

from . import figures as F
from .tree_plot import tree_figure
from . import tables as T

# Above this many drafted nodes a tree figure shows only the verified tree: the paper's dynamic
# budget drafts ~600 nodes per round, which no page can label legibly.
MAX_PRUNED_SHOWN = 120


def build_tables(nodes: pd.DataFrame, steps: pd.DataFrame, bins: int = 10,
                 seconds: pd.Series | None = None) -> dict[str, pd.DataFrame]:
    """The summary tables (the per-node and per-step frames are passed in, not repeated here);
    `seconds`: the traces' wall times (tables.trace_seconds) for the rates in compare_modes."""
    return {
        "compare_modes": T.mode_summary(steps, seconds),
        "calibration_confidence": T.calibration_table(nodes, "confidence", bins),
        "calibration_value": T.calibration_table(nodes, "value", bins),
        "calibration_confidence_by_depth": T.calibration_table(nodes, "confidence", bins, per_depth=True),
        "ece": ece_table(nodes, bins),
        "depth_rank": T.depth_rank_table(nodes),
        "static_positions": T.static_position_table(nodes),
        "accept_length": T.accept_length_table(steps),
        "depth_profile": T.depth_profile(nodes),
        "tree_shape": T.tree_shape_summary(steps),
    }


def ece_table(nodes: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """ECE of confidence and value, over all modes and per mode."""
    rows = []
    for mode, sample in [("all", nodes), *nodes.groupby("mode", sort=True)]:
        for by in ("confidence", "value"):
            table = T.calibration_table(sample, by, bins)
            rows.append({"mode": mode, "by": by, "ece": T.table_ece(table),
                         "nodes": int(table["count"].sum())})
    return pd.DataFrame(rows, columns=["mode", "by", "ece", "nodes"])


def example_steps(traces: list[Trace]) -> dict[str, StepRecord]:
    """Per mode with a draft: the round with the longest acceptance (the first such) and a typical one
    (accept_length at the median)."""
    picks: dict[str, StepRecord] = {}
    rounds = [s for t in traces for s in t.steps if len(s.nodes) > 1]
    for mode in sorted({s.mode for s in rounds}):
        mine = [s for s in rounds if s.mode == mode]
        picks[f"tree_{mode}_best"] = max(mine, key=lambda s: s.accept_length)
        median = sorted(s.accept_length for s in mine)[len(mine) // 2]
        picks[f"tree_{mode}_typical"] = next(s for s in mine if s.accept_length == median)
    return picks


def build_figures(traces: list[Trace], nodes: pd.DataFrame, steps: pd.DataFrame,
                  bins: int = 10) -> dict[str, go.Figure]:
    figs = {
        "reliability_confidence": F.reliability_figure(nodes, "confidence", bins),
        "reliability_confidence_by_depth": F.reliability_figure(nodes, "confidence", bins, per_depth=True),
        "reliability_value": F.reliability_figure(nodes, "value", bins),
        "depth_rank_heatmap": F.depth_rank_heatmap(nodes),
        "accept_length": F.accept_length_figure(steps),
    }
    if (nodes["mode"] == "static").any():
        figs["static_positions"] = F.static_position_figure(nodes)
    for name, step in example_steps(traces).items():
        figs[name] = tree_figure(step, show_pruned=len(step.nodes) - 1 <= MAX_PRUNED_SHOWN)
    return figs
