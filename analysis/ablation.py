"""The recipe ablation and data-scaling curve from `python -m eagle ablation`'s ablation.json: a table (one
row per recipe and data fraction) and one figure, held-out accuracy at each draft step against the data
fraction with one line per recipe, and MT-bench tau in a last panel when the run measured it."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from eagle.records.files import read_json_object
from eagle.records.markdown import markdown_table

from .figures import PALETTE, paper_layout

RECIPE_LABELS = {"eagle1": "EAGLE-1 recipe", "eagle1-ttt": "+ training-time test", "eagle3": "EAGLE-3"}
STEP_COLUMNS = ("acc_step1", "acc_step2", "acc_step3", "acc_step4")
POINT_KEYS = {"recipe", "fraction", "train_samples", "steps", "heldout"}
MORE = "+more"  # a point trained with ablation --more-features added to its recipe's data


def recipe_label(recipe: str) -> str:
    base = recipe.removesuffix(MORE)
    return RECIPE_LABELS.get(base, base) + (" + more data" if recipe.endswith(MORE) else "")


def load_ablation(path: str | Path) -> dict:
    """An ablation.json (one sentence when it is missing, not JSON, or holds no point)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ablation results at {path}: run `python -m eagle ablation` first.")
    results = read_json_object(path, "--results", ": give the ablation.json that `python -m eagle ablation` wrote")
    if not isinstance(results.get("points"), dict) or not results["points"]:
        raise ValueError(f"--results {path} holds no finished point: let `python -m eagle ablation` finish one.")
    for name, point in results["points"].items():
        heldout = point.get("heldout") if isinstance(point, dict) else None
        if not isinstance(heldout, dict) or not POINT_KEYS <= set(point) or not set(STEP_COLUMNS) <= set(heldout):
            raise ValueError(f"--results {path}: point {name!r} is not an ablation point (it lacks "
                             f"{', '.join(sorted(POINT_KEYS))} or held-out accuracies per step).")
    return results


def ablation_frame(results: dict) -> pd.DataFrame:
    """One row per point, sorted by recipe (in RECIPE_LABELS' order) and fraction: accuracies as fractions,
    tau NaN where the point has none."""
    # a point trained with --more-features is a line of its own beside its recipe's
    rows = [{"recipe": p["recipe"] + (MORE if "more_samples" in p else ""), "fraction": float(p["fraction"]),
             "train_samples": int(p["train_samples"]), "more_samples": int(p.get("more_samples", 0)),
             "steps": int(p["steps"]), **{k: float(p["heldout"][k]) for k in STEP_COLUMNS},
             "tau": float(p["tau"]["tau"]) if "tau" in p else math.nan}
            for p in results["points"].values()]
    order = {r: i for i, r in enumerate(RECIPE_LABELS)}
    frame = pd.DataFrame(rows)
    # where a point sits on the data axis: its share of the features' training samples, so a point trained with
    # more data lies beyond 1, by how many samples the more features added
    total = results.get("train_samples_total")
    frame["data"] = frame["fraction"] if not total else frame["fraction"] + frame["more_samples"] / float(total)
    # a +more line right after its recipe's
    frame["_order"] = frame["recipe"].map(lambda r: order.get(r.removesuffix(MORE), len(order)) + r.endswith(MORE) / 2)
    return frame.sort_values(["_order", "fraction"]).drop(columns="_order").reset_index(drop=True)


def ablation_figure(results: dict) -> go.Figure:
    """Held-out accuracy per draft step (one panel each) against the data fraction, one line per recipe;
    a last panel of MT-bench tau when any point has one."""
    frame = ablation_frame(results)
    has_tau = bool(frame["tau"].notna().any())
    titles = [f"draft step {j}" for j in range(1, len(STEP_COLUMNS) + 1)] + (["MT-bench τ"] if has_tau else [])
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.05)
    bases = list(dict.fromkeys(r.removesuffix(MORE) for r in frame["recipe"]))
    for recipe, rows in frame.groupby("recipe", sort=False):
        base = recipe.removesuffix(MORE)
        more = recipe != base  # in its recipe's colour, dotted, from the recipe's point at the same fraction
        if more:
            rows = pd.concat([frame[(frame["recipe"] == base) & frame["fraction"].isin(rows["fraction"])], rows])
        style = dict(line=dict(color=PALETTE[bases.index(base) % len(PALETTE)], width=3, dash="dot" if more else None),
                     marker=dict(size=10, symbol="diamond" if more else "circle"))
        columns = [*STEP_COLUMNS, *(["tau"] if has_tau else [])]
        for col, key in enumerate(columns, 1):
            scale = 1 if key == "tau" else 100
            fig.add_trace(go.Scatter(x=rows["data"], y=rows[key] * scale, mode="lines+markers",
                                     name=recipe_label(recipe), legendgroup=recipe, showlegend=col == 1, **style),
                          row=1, col=col)
    fractions = sorted(frame["data"].unique())
    fig.update_xaxes(type="log", tickvals=fractions, ticktext=[f"{f:.3g}" for f in fractions], title_text="data")
    top = float(frame[list(STEP_COLUMNS)].max().max()) * 100
    for col in range(1, len(STEP_COLUMNS) + 1):  # one accuracy scale, so the panels compare by eye
        fig.update_yaxes(range=[0, max(top * 1.08, 1.0)], row=1, col=col)
    fig.update_yaxes(title_text="held-out accuracy (%)", row=1, col=1)
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    steps = ", ".join(str(s) for s in sorted(frame["steps"].unique()))
    subtitle = f"{steps} steps per point, {results.get('train_samples_total', '?')} training samples in all, " \
               f"{results.get('heldout_samples', '?')} held out"
    fig = paper_layout(fig, f"Recipe ablation and data scaling<br><sup>{subtitle}</sup>", height=540)
    return fig.update_layout(margin=dict(t=130))  # room for the subtitle above the panel titles


def ablation_markdown(results: dict) -> str:
    """The table for TRAINING.md: accuracy in percent per draft step, tau where measured."""
    frame = ablation_frame(results)
    has_tau = bool(frame["tau"].notna().any())
    header = ["recipe", "data", "train samples", "step 1", "step 2", "step 3", "step 4"] + (["τ"] if has_tau else [])
    cells = [[recipe_label(r.recipe), f"{r.fraction:g}",
              f"{r.train_samples} + {r.more_samples}" if r.more_samples else str(r.train_samples),
              *(f"{getattr(r, k) * 100:.1f} %" for k in STEP_COLUMNS),
              *([f"{r.tau:.2f}" if not math.isnan(r.tau) else ""] if has_tau else [])]
             for r in frame.itertuples(index=False)]
    return markdown_table(header, cells, [False] + [True] * (len(header) - 1)) + "\n"
