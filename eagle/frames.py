"""Decoded traces as pandas tables: one row per drafted node (`nodes_frame`) and one per step
(`steps_frame`). They live in eagle, not analysis, so `eagle.explore` can hand them out without eagle
importing analysis (imports flow app -> analysis -> eagle); analysis re-exports them and builds its
summaries on top. Nothing else in eagle imports this module, so `import eagle` stays pandas-free.

Every function taking traces accepts a Trace, a Generation (eagle.core.decode), anything with a `.trace`
(eagle.explore's Exploration) or a list of those.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Union

import numpy as np
import pandas as pd

from .core.decode import Generation
from .records.timing import STEP_PHASES, phase_seconds
from .records.trace import NodeRecord, StepRecord, Trace, TraceHeader

TraceLike = Union[Trace, Generation, Iterable]  # Iterable of any of these, or an object with .trace

NODE_COLUMNS = ["trace", "prompt_id", "mode", "step", "id", "parent", "depth", "rank", "position",
                "token", "text", "confidence", "value", "kept", "accepted", "parent_accepted",
                "target_prob", "source"]
STEP_COLUMNS = ["trace", "prompt_id", "mode", "step", "prefill", "accept_length", "accepted_drafts",
                "new_tokens", "target_forwards", "drafted", "tree_size", "max_depth", "width", "leaves",
                *(f"t_{p}" for p in STEP_PHASES), "seconds", "finished",
                "total_tokens", "cfg_depth", "top_k", "temperature"]
# Header meta keys that name the prompt, most specific first (MT-bench uses question_id).
PROMPT_ID_KEYS = ("question_id", "prompt_id", "id")


def prompt_id(header: TraceHeader) -> object:
    """The prompt's id from the header meta, or None when the trace does not carry one."""
    return next((header.meta[k] for k in PROMPT_ID_KEYS if k in header.meta), None)


def rank_paths(nodes: list[NodeRecord]) -> dict[int, str]:
    """Node id -> its position as the sibling ranks from the root, e.g. "0-1-0" ("" for the root).
    The static tree verifies the same positions every round, so this names a node across rounds."""
    by_id = {n.id: n for n in nodes}
    paths: dict[int, str] = {}
    for n in sorted(nodes, key=lambda n: n.depth):  # parents sit one level above their children
        parent_path = paths.get(n.parent) if n.parent in by_id else None
        if parent_path is None:
            paths[n.id] = ""
        else:
            paths[n.id] = f"{parent_path}-{n.rank}" if parent_path else str(n.rank)
    return paths


def _node_rows(i: int, pid: object, step: StepRecord) -> list[dict]:
    by_id = {n.id: n for n in step.nodes}
    paths = rank_paths(step.nodes)
    return [{"trace": i, "prompt_id": pid, "mode": step.mode, "step": step.step, "id": n.id,
             "parent": n.parent, "depth": n.depth, "rank": n.rank, "position": paths[n.id],
             "token": n.token, "text": n.text, "confidence": n.confidence, "value": n.value,
             "kept": bool(n.kept), "accepted": bool(n.accepted),
             "parent_accepted": bool(by_id[n.parent].accepted) if n.parent in by_id else False,
             "target_prob": np.nan if n.target_prob is None else n.target_prob, "source": n.source}
            for n in step.nodes if n.parent >= 0]


def nodes_frame(traces: TraceLike) -> pd.DataFrame:
    """One row per drafted node of every step (the root is left out: it is not a draft)."""
    traces = as_traces(traces)
    rows = [row for i, t in enumerate(traces) for s in t.steps
            for row in _node_rows(i, prompt_id(t.header), s)]
    frame = pd.DataFrame(rows, columns=NODE_COLUMNS)
    return frame.astype({"kept": bool, "accepted": bool, "parent_accepted": bool,
                         "confidence": float, "value": float, "target_prob": float})


def tree_shape(step: StepRecord) -> dict[str, int]:
    """Shape of the verified draft tree (root excluded): size, deepest level, widest level, leaves."""
    kept = [n for n in step.nodes if n.kept and n.parent >= 0]
    per_depth = Counter(n.depth for n in kept)
    parents = {n.parent for n in kept}
    return {"drafted": sum(1 for n in step.nodes if n.parent >= 0), "tree_size": len(kept),
            "max_depth": max(per_depth, default=0), "width": max(per_depth.values(), default=0),
            "leaves": sum(1 for n in kept if n.id not in parents)}


def _step_row(i: int, header: TraceHeader, step: StepRecord) -> dict:
    t = step.timings
    prefill = step.step == 0 or "prefill" in t
    cfg = header.config
    return {"trace": i, "prompt_id": prompt_id(header), "mode": step.mode, "step": step.step,
            "prefill": prefill, "accept_length": step.accept_length,
            "accepted_drafts": 0 if prefill else max(0, step.accept_length - 1),
            "new_tokens": len(step.new_tokens), "target_forwards": step.target_forwards,
            **tree_shape(step),
            **{f"t_{k}": phase_seconds(t, k) for k in STEP_PHASES},
            "seconds": float(sum(t.values())), "finished": step.finished,
            "total_tokens": cfg.get("total_tokens"), "cfg_depth": cfg.get("depth"),
            "top_k": cfg.get("top_k"), "temperature": cfg.get("temperature")}


def steps_frame(traces: TraceLike) -> pd.DataFrame:
    """One row per step. tree_size counts the verified draft tokens (the config's total_tokens
    counts the root too); accepted_drafts = accept_length - 1 (0 for the prefill)."""
    traces = as_traces(traces)
    rows = [_step_row(i, t.header, s) for i, t in enumerate(traces) for s in t.steps]
    return pd.DataFrame(rows, columns=STEP_COLUMNS).astype({"prefill": bool})


def as_traces(obj: TraceLike) -> list[Trace]:
    """Normalise what a user holds to a list of Traces. A bare Generation carries no header, so it gets
    an empty one (no model, no config): tables built from it have prompt_id None and no config columns."""
    if isinstance(obj, Trace):
        return [obj]
    if isinstance(obj, Generation):
        header = TraceHeader(model="", head=None, config={}, prompt="", prompt_tokens=len(obj.prompt_ids))
        return [Trace(header, list(obj.steps))]
    if isinstance(getattr(obj, "trace", None), Trace):
        return [obj.trace]
    if isinstance(obj, (str, bytes)) or not isinstance(obj, Iterable):
        raise TypeError(f"expected a Trace, a Generation or a list of them, got {type(obj).__name__}")
    return [t for item in obj for t in as_traces(item)]
