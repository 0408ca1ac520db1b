"""Pure pandas tables built from decoded traces: one row per drafted node, one row per step, and the
summaries the paper figures plot (calibration, per-position acceptance, accepted lengths, modes).

Conventions used throughout:
* The root of a step's tree (the last committed token) is not a drafted node: `nodes_frame` omits it.
* A node is *verified* when it survived reranking (`kept`). A verified node only had a chance to be
  accepted if its parent was accepted, so conditional acceptance rates use the *eligible* nodes:
  verified nodes whose parent was accepted.
* Step 0 of every trace is the prefill (no draft); per-round statistics leave it out.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from eagle.records.stats import mean, speedup, tau, tokens_per_second, wilson_interval
from eagle.core.config import MODES
# The record -> row tables live in eagle.frames (so eagle.explore can return them); re-exported here.
from eagle.frames import (  # noqa: F401
    NODE_COLUMNS,
    STEP_COLUMNS,
    TraceLike,
    as_traces,
    nodes_frame,
    prompt_id,
    rank_paths,
    steps_frame,
    tree_shape,
)

CalibrationBy = Literal["confidence", "value"]

# ---- calibration ----------------------------------------------------------------------------------
def calibration_sample(nodes: pd.DataFrame, by: CalibrationBy = "confidence") -> pd.DataFrame:
    """The nodes a calibration statistic is measured on, with `pred` (the prediction) and
    `hit` (the event) columns.

    by="confidence": confidence is the draft's probability of the token *given its parent*, so the
    event is "accepted given the parent was accepted", over verified nodes whose parent was accepted
    (a node whose parent was rejected never had a chance and would bias the rate down).
    by="value": value is the path product, a prediction of the whole path being right, so the
    event is "accepted" over all verified nodes. Only the head's nodes count: a prompt-lookup node
    (source "lookup") is a copy whose confidence of 1 predicts nothing."""
    if by not in ("confidence", "value"):
        raise ValueError(f"by must be 'confidence' or 'value', got {by!r}")
    mask = nodes["kept"] & nodes["parent_accepted"] if by == "confidence" else nodes["kept"]
    mask &= nodes["source"] == "draft"
    sample = nodes.loc[mask, ["mode", "depth", "rank", by, "accepted"]]
    return sample.rename(columns={by: "pred", "accepted": "hit"}).astype({"pred": float, "hit": float})


def with_wilson(table: pd.DataFrame) -> pd.DataFrame:
    """ci_lo and ci_hi: the 95 % Wilson interval of accepted / count on every row."""
    ci = [wilson_interval(a, n) for a, n in zip(table["accepted"], table["count"])]
    return table.assign(ci_lo=[lo for lo, _ in ci], ci_hi=[hi for _, hi in ci])


def calibration_table(nodes: pd.DataFrame, by: CalibrationBy = "confidence", bins: int = 10,
                      per_depth: bool = False, min_count: int = 1) -> pd.DataFrame:
    """Equal-width bins of the prediction on [0, 1]: mean prediction, empirical acceptance rate,
    count and accepted per (depth and) bin, the rate's 95 % Wilson interval, and `enough` (the bin
    holds at least min_count nodes; table_ece and the figure use only those). Empty bins are left
    out: a missing bin is no data, a rate of 0 is a measurement. See calibration_sample for which
    nodes count and what the event is."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    sample = calibration_sample(nodes, by)
    inner_edges = np.linspace(0.0, 1.0, bins + 1)[1:-1]
    # Clip: float products can land a hair outside [0, 1]; 1.0 belongs to the last bin.
    sample = sample.assign(bin=np.clip(np.digitize(sample["pred"], inner_edges), 0, bins - 1))
    keys = ["depth", "bin"] if per_depth else ["bin"]
    table = (sample.groupby(keys, sort=True)
             .agg(mean_pred=("pred", "mean"), rate=("hit", "mean"), count=("hit", "size"),
                  accepted=("hit", "sum"))
             .reset_index())
    table.insert(len(keys), "lo", table["bin"] / bins)
    table.insert(len(keys) + 1, "hi", (table["bin"] + 1) / bins)
    table = with_wilson(table.astype({"count": int, "accepted": int}))
    return table.assign(enough=table["count"] >= min_count)


def table_ece(table: pd.DataFrame) -> float:
    """Count-weighted mean |rate - mean prediction| over the rows of a calibration table (only the
    bins with enough nodes, when the table says which)."""
    if "enough" in table:
        table = table[table["enough"]]
    total = table["count"].sum()
    if total == 0:
        return float("nan")
    return float((table["count"] * (table["rate"] - table["mean_pred"]).abs()).sum() / total)


def expected_calibration_error(nodes: pd.DataFrame, by: CalibrationBy = "confidence",
                               bins: int = 10) -> float:
    """ECE of the draft's `by` over equal-width bins (NaN when no node qualifies)."""
    return table_ece(calibration_table(nodes, by, bins))


# ---- per-position acceptance ----------------------------------------------------------------------
def _eligible(nodes: pd.DataFrame) -> pd.DataFrame:
    """The head's verified nodes whose parent was accepted: the ones that could have been accepted
    (prompt-lookup nodes have no sibling rank or confidence to tabulate)."""
    return nodes[nodes["kept"] & nodes["parent_accepted"] & (nodes["source"] == "draft")]


def depth_rank_table(nodes: pd.DataFrame) -> pd.DataFrame:
    """Acceptance rate given the parent was accepted, per depth x sibling rank, with counts."""
    table = (_eligible(nodes).groupby(["depth", "rank"], sort=True)
             .agg(rate=("accepted", "mean"), count=("accepted", "size"), accepted=("accepted", "sum"))
             .reset_index())
    return table.astype({"rate": float, "count": int, "accepted": int})


def _position_key(position: str) -> tuple[int, tuple[int, ...]]:
    ranks = tuple(int(r) for r in position.split("-")) if position else ()
    return len(ranks), ranks


def static_position_table(nodes: pd.DataFrame, mode: str | None = "static") -> pd.DataFrame:
    """Acceptance (given the parent was accepted) of each fixed tree position ("0-1-0": rank path
    from the root), measured per trace (prompt), then its mean, std, quartiles over traces; `rate` is
    the pooled rate over all rounds, with its 95 % Wilson interval. mode=None pools every mode."""
    sample = _eligible(nodes if mode is None else nodes[nodes["mode"] == mode])
    per_trace = (sample.groupby(["position", "trace"])["accepted"]
                 .agg(["mean", "size", "sum"]).reset_index())
    grouped = per_trace.groupby("position")
    table = pd.DataFrame({
        "mean": grouped["mean"].mean(), "std": grouped["mean"].std(ddof=1),
        "q25": grouped["mean"].quantile(0.25), "q75": grouped["mean"].quantile(0.75),
        "traces": grouped["trace"].nunique(), "count": grouped["size"].sum(),
        "accepted": grouped["sum"].sum()}).reset_index()
    table.insert(1, "depth", [_position_key(p)[0] for p in table["position"]])
    table["rate"] = table["accepted"] / table["count"]
    table = with_wilson(table)
    order = sorted(range(len(table)), key=lambda i: _position_key(table["position"].iloc[i]))
    return table.iloc[order].reset_index(drop=True)


# ---- accepted length, tree shape, modes -----------------------------------------------------------
def _rounds(steps: pd.DataFrame) -> pd.DataFrame:
    return steps[~steps["prefill"]]


def accept_length_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Distribution of accept_length (accepted drafts + bonus) per mode over the decoding rounds."""
    counts = _rounds(steps).groupby(["mode", "accept_length"]).size().rename("count").reset_index()
    counts["fraction"] = counts["count"] / counts.groupby("mode")["count"].transform("sum")
    return counts


def depth_profile(nodes: pd.DataFrame) -> pd.DataFrame:
    """Per mode and depth: drafted and verified nodes per round, and the acceptance rate given the
    parent was accepted."""
    rounds = nodes.drop_duplicates(["mode", "trace", "step"]).groupby("mode").size()
    table = nodes.groupby(["mode", "depth"]).agg(drafted=("id", "size"), kept=("kept", "sum"))
    table = table.reset_index()
    per_round = table["mode"].map(rounds).astype(float)
    table["drafted_per_round"] = table["drafted"] / per_round
    table["kept_per_round"] = table["kept"] / per_round
    rate = _eligible(nodes).groupby(["mode", "depth"])["accepted"].mean().rename("rate")
    return table.merge(rate.reset_index(), on=["mode", "depth"], how="left")


def tree_shape_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Mean and spread of the verified tree's size, depth, width and leaves per mode."""
    cols = ["drafted", "tree_size", "max_depth", "width", "leaves"]
    table = _rounds(steps).groupby("mode")[cols].agg(["mean", "std", "min", "max"])
    table.columns = [f"{c}_{stat}" for c, stat in table.columns]
    return table.reset_index()


def mode_order(modes: pd.Series) -> list:
    """The modes present, vanilla -> static -> dynamic first, any other after."""
    return sorted(modes.unique(), key=lambda m: (MODES.index(m) if m in MODES else len(MODES), str(m)))


def trace_seconds(traces: TraceLike) -> pd.Series:
    """Per trace (indexed as steps_frame's `trace` column): the generation's wall-clock seconds, as
    the header's meta "seconds" records it (bench, the app, explore() and `generate --trace` write
    it), else the sum of its steps' own timings (older traces; a slight undercount, since it leaves
    out the host time between rounds)."""
    out = []
    for t in as_traces(traces):
        wall = t.header.meta.get("seconds")
        timed = isinstance(wall, (int, float)) and not isinstance(wall, bool) and wall > 0
        out.append(float(wall) if timed else float(sum(sum(s.timings.values()) for s in t.steps)))
    return pd.Series(out, dtype=float, name="seconds")


def compare_modes(traces: TraceLike) -> pd.DataFrame:
    """Per mode: tau = new tokens / target forwards (the prefill counts as one of each), mean
    accept_length and tree size per round, tokens/s (total tokens over the generations' total wall
    seconds, eagle.records.stats), the draft's share of that time, and the speed-up over vanilla when
    vanilla traces are present."""
    return mode_summary(steps_frame(traces), trace_seconds(traces))


def mode_summary(steps: pd.DataFrame, seconds: pd.Series | None = None) -> pd.DataFrame:
    """compare_modes on an existing steps_frame; `seconds` is trace_seconds of the same traces (None:
    each trace's time is the sum of its steps' timings)."""
    rows = []
    for mode in mode_order(steps["mode"]):
        s = steps[steps["mode"] == mode]
        r = _rounds(s)
        wall = s["seconds"].sum() if seconds is None else seconds.loc[s["trace"].unique()].sum()
        tokens, forwards = int(s["new_tokens"].sum()), int(s["target_forwards"].sum())
        rows.append({"mode": mode, "traces": s["trace"].nunique(), "rounds": len(r),
                     "new_tokens": tokens, "target_forwards": forwards, "tau": tau(tokens, forwards),
                     "mean_accept_length": mean(r["accept_length"]),
                     "mean_tree_size": mean(r["tree_size"]), "seconds": float(wall),
                     "tokens_per_s": tokens_per_second(tokens, wall),
                     "draft_share": s["t_draft"].sum() / wall if wall > 0 else np.nan})
    table = pd.DataFrame(rows, columns=["mode", "traces", "rounds", "new_tokens", "target_forwards",
                                        "tau", "mean_accept_length", "mean_tree_size", "seconds",
                                        "tokens_per_s", "draft_share"])
    vanilla = table.loc[table["mode"] == "vanilla", "tokens_per_s"]
    reference = vanilla.iloc[0] if len(vanilla) else np.nan
    table["speedup"] = [speedup(rate, reference) for rate in table["tokens_per_s"]]
    return table


# ---- the Compare page's table, in words -----------------------------------------------------------
MODE_NAMES = {"vanilla": "vanilla (no draft)", "hf_pld": "prompt lookup (HF generate)",
              "static": "static tree (EAGLE-1)", "dynamic": "dynamic tree (EAGLE-2)"}
PLAIN_ROWS = {  # mode_summary column -> (what it is, in words; format)
    "new_tokens": ("Tokens generated", "{:.0f}"),
    "target_forwards": ("Target forward passes", "{:.0f}"),
    "tau": ("Tokens per target forward (τ)", "{:.2f}"),
    "mean_accept_length": ("Tokens per round, mean (accepted drafts + bonus)", "{:.2f}"),
    "mean_tree_size": ("Nodes verified per round, mean", "{:.1f}"),
    "seconds": ("Wall-clock seconds", "{:.2f}"),
    "tokens_per_s": ("Tokens per second", "{:.1f}"),
    "draft_share": ("Share of the time spent drafting", "{:.0%}"),
    "speedup": ("Speed-up over vanilla (tokens per second)", "{:.2f}x"),
}


def with_baseline_rows(summary: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """mode_summary plus modes that leave no trace (prompt lookup through HF generate: new_tokens,
    target_forwards, seconds), their tau and tokens/s computed as for every mode, and the speed-up
    over vanilla recomputed; the tree columns of such a row stay NaN (it has no rounds)."""
    extra = [{**r, "tau": tau(r["new_tokens"], r["target_forwards"]),
              "tokens_per_s": tokens_per_second(r["new_tokens"], r["seconds"])} for r in rows]
    table = pd.concat([summary, pd.DataFrame(extra)], ignore_index=True) if extra else summary.copy()
    vanilla = table.loc[table["mode"] == "vanilla", "tokens_per_s"]
    reference = vanilla.iloc[0] if len(vanilla) else np.nan
    table["speedup"] = [speedup(rate, reference) for rate in table["tokens_per_s"]]
    order = ["vanilla", "hf_pld", "static", "dynamic"]
    return table.sort_values("mode", key=lambda m: m.map(lambda x: order.index(x) if x in order else 9),
                             kind="stable").reset_index(drop=True)


def plain_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One column per mode under its plain name, one row per measure in words, values formatted
    ("–" where a measure does not apply: a tree size for vanilla, a speed-up without vanilla)."""
    out = {}
    for _, row in table.iterrows():
        out[MODE_NAMES.get(row["mode"], row["mode"])] = [
            "–" if pd.isna(row.get(col)) else fmt.format(row[col]) for col, (_, fmt) in PLAIN_ROWS.items()]
    return pd.DataFrame(out, index=[name for name, _ in PLAIN_ROWS.values()])
