"""Analysis of recorded draft trees: pandas tables, plotly figures, export (never imports streamlit)."""
from .figures import (
    accept_length_figure,
    depth_rank_heatmap,
    reliability_figure,
    static_position_figure,
)
from .tree_plot import tree_figure, tree_layout
from .tables import (
    accept_length_table,
    calibration_table,
    compare_modes,
    depth_profile,
    depth_rank_table,
    expected_calibration_error,
    mode_summary,
    nodes_frame,
    static_position_table,
    steps_frame,
    trace_seconds,
    tree_shape_summary,
)

__all__ = [
    "accept_length_figure", "accept_length_table", "calibration_table", "compare_modes", "depth_profile",
    "depth_rank_heatmap", "depth_rank_table", "expected_calibration_error", "mode_summary", "nodes_frame",
    "reliability_figure", "static_position_figure", "static_position_table", "steps_frame", "trace_seconds",
    "tree_figure", "tree_layout", "tree_shape_summary",
]
