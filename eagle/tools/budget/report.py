"""The auto report: what `--budget auto` chose on this machine and why, as one typed AutoReport, and
the cached file it is read from (one JSON object per machine key, head weights and settings, checked
when read: a malformed one is chosen again)."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from ...core.config import TreeShape
from ...records.files import read_json_or_none
from ...records.schema import FileFormatError, check_in, check_object, check_value, fail
from .costs import DEPTHS, Costs, check_costs, check_seconds
from .replay import AcceptModel

Row = dict  # one budget of the searched grid: TreeShape's keys, accept_length, round_s, tokens_per_s, speedup


@dataclass(frozen=True)
class AutoReport:
    """auto_config's answer. expected_speedup and beats_vanilla are against the fastest vanilla decoding
    here (any precision: vanilla_dtype), the *_same_dtype figures against vanilla at the target's own;
    the rows of curve, top and best_per_vocab keep their same-dtype speed-ups."""
    chosen: dict[str, int]  # the budget: TreeShape's keys (as a TreeShape: .shape)
    curve: list[Row]  # the chosen depth, top_k and vocabulary at every searched total_tokens
    top: list[Row]  # the five best budgets
    best_per_vocab: list[Row]  # the best budget of each draft vocabulary, best first
    by_context: list[dict]  # per measured context length: context, TreeShape's keys and speedup there
    expected_tokens_per_s: float
    expected_accept_length: float
    lookup_tokens: int  # the prompt-lookup branch's longest length the budgets were replayed with (0: none)
    expected_lookup_nodes: float  # the chosen budget's mean lookup nodes per round
    expected_speedup: float
    expected_speedup_same_dtype: float
    beats_vanilla: bool
    vanilla_tokens_per_s: float  # the fastest vanilla here
    vanilla_same_dtype_tokens_per_s: float
    vanilla_dtype: str
    same_dtype_factor: float  # vanilla at the target's dtype over the fastest vanilla
    t_plain: float  # seconds per plain-decoding token at the reference context
    t_verify: dict[str, float]  # tree tokens (as in the JSON) -> seconds of a verify at the reference context
    alpha: float  # the value calibration: E[accept length] = 1 + alpha * (sum of the kept values)
    host_ms: dict[str, float]  # "tree", "plain": ms per round a real decode spends beyond the probes
    calibration_rounds: int
    calibration_accept_length: float
    costs: Costs
    accept_table: AcceptModel
    costs_file: str
    auto_file: str
    context: int | None = None  # tuned_config's: the context length of the generation ahead
    context_choice: dict | None = None  # the budget there: TreeShape's keys, speedup, speedup_same_dtype

    @classmethod
    def from_cached(cls, cached: dict, fastest: dict, path: Path) -> "AutoReport":
        """A cached report (same-dtype speed-ups, as measured) restated against `fastest` vanilla
        ({"dtype", "tokens_per_s"}, choice.fastest_vanilla)."""
        factor = cached["vanilla_tokens_per_s"] / fastest["tokens_per_s"]
        same = {f.name: cached[f.name] for f in fields(cls) if f.name in CACHED_FIELDS}
        return cls(**same, by_context=[{**r, "speedup": r["speedup"] * factor} for r in cached.get("by_context", [])],
                   expected_speedup=cached["expected_speedup"] * factor,
                   expected_speedup_same_dtype=cached["expected_speedup"],
                   beats_vanilla=cached["expected_speedup"] * factor > 1.0,
                   vanilla_tokens_per_s=fastest["tokens_per_s"],
                   vanilla_same_dtype_tokens_per_s=cached["vanilla_tokens_per_s"], vanilla_dtype=fastest["dtype"],
                   same_dtype_factor=factor, costs=Costs.from_json(cached["costs"]),
                   accept_table=AcceptModel.from_json(cached["accept_table"]), auto_file=str(path))

    @property
    def shape(self) -> TreeShape:
        """The chosen budget's tree."""
        return TreeShape.of(self.chosen)

    @property
    def vanilla_label(self) -> str:
        """What expected_speedup is against, for a sentence: "vanilla bfloat16, the fastest here"."""
        return f"vanilla {self.vanilla_dtype}, the fastest here"

    def to_json(self) -> dict:
        """Every field as JSON (budget --json, bench's summary.json)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**out, "costs": self.costs.to_json(), "accept_table": self.accept_table.to_json()}


# What the cached file holds as is (the rest is derived when it is read: AutoReport.from_cached).
CACHED_FIELDS = ("chosen", "curve", "top", "best_per_vocab", "expected_tokens_per_s", "expected_accept_length",
                 "lookup_tokens", "expected_lookup_nodes",
                 "t_plain", "t_verify", "alpha", "host_ms", "calibration_rounds", "calibration_accept_length",
                 "costs_file")
REPORT_KINDS = {"curve": "list", "vanilla_tokens_per_s": "nonneg", "t_plain": "nonneg", "t_verify": "dict",
                "alpha": "num", "chosen": "dict", "expected_tokens_per_s": "nonneg", "expected_speedup": "nonneg",
                "expected_accept_length": "nonneg", "lookup_tokens": "int", "expected_lookup_nodes": "nonneg",
                "costs": "dict", "accept_table": "dict", "top": "list",
                "by_context": "list", "best_per_vocab": "list", "host_ms": "dict", "calibration_rounds": "int",
                "calibration_accept_length": "num", "costs_file": "str"}
ACCEPT_KINDS = {"ns": "ints", "depths": "ints", "top_ks": "ints", "vocabs": "ints", "grid": "dict",
                "lookup_tokens": "int", "lookup_grid": "dict"}


def read_auto_report(path: Path, ns: tuple[int, ...], top_ks: tuple[int, ...],
                     vocabs: tuple[int, ...]) -> dict | None:
    """A cached auto-budget report, or None (chosen again) when missing or malformed: its costs a cost
    cache, its choice within the searched grid and on its curve, its accept table a grid per top_k/vocab."""
    report = read_json_or_none(path)
    if report is None:
        return None
    try:
        check_object(report, path, "report", REPORT_KINDS)
        t_verify = report["t_verify"]
        check_seconds(t_verify, path, "field 't_verify'")
        if "1" not in t_verify or t_verify["1"] <= 0 or report["t_plain"] <= 0:
            fail(path, "field 't_verify' or 't_plain'", "lacks the one-token time")
        check_costs(report["costs"], path, "field 'costs'")
        _check_choice(report, path, ns, top_ks, vocabs)
        _check_accept_table(report["accept_table"], path)
    except FileFormatError:
        return None
    return report


def _check_choice(report: dict, path: Path, ns: tuple[int, ...], top_ks: tuple[int, ...],
                  vocabs: tuple[int, ...]) -> None:
    chosen = check_object(report["chosen"], path, "field 'chosen'", {k: "nat" for k in TreeShape.keys()})
    check_in(chosen["total_tokens"], ns, path, "field 'chosen' total_tokens")
    check_in(chosen["top_k"], top_ks, path, "field 'chosen' top_k")
    check_in(chosen["draft_vocab"], vocabs, path, "field 'chosen' draft_vocab")
    if chosen["depth"] > max(DEPTHS):  # depth 0 (the root's children only) is in the searched grid
        fail(path, "field 'chosen' depth", f"is beyond the searched {max(DEPTHS)}")
    for i, row in enumerate(report["curve"]):
        check_object(row, path, f"field 'curve' [{i}]", {"total_tokens": "nat"})
    if not any(row["total_tokens"] == chosen["total_tokens"] for row in report["curve"]):
        fail(path, "field 'curve'", "lacks the chosen total_tokens")
    for i, row in enumerate(report["by_context"]):  # restated against the fastest vanilla when read
        check_object(row, path, f"field 'by_context' [{i}]", {"context": "nat", "speedup": "nonneg",
                                                                  **{k: "nat" for k in TreeShape.keys()}})


def _check_accept_table(table: dict, path: Path) -> None:
    """The replayed grids a cached report chooses again from: per "top_k/vocab", accept lengths (and
    lookup-branch sizes, and the share of rounds with a branch) >= 0 for every depth (rows) and tree
    size (columns), the same shapes in each."""
    check_object(table, path, "field 'accept_table'", ACCEPT_KINDS, {"lookup_share_grid": "dict"})
    rows, cols = len(table["depths"]), len(table["ns"])
    grids = ("grid", "lookup_grid") + (("lookup_share_grid",) if "lookup_share_grid" in table else ())
    for name in grids[1:]:
        if set(table[name]) != set(table["grid"]):
            fail(path, f"field 'accept_table' {name}", "does not cover the same top_k/vocab shapes as its grid")
    for name in grids:
        for shape, grid in table[name].items():
            where = f"field 'accept_table' {name} {shape!r:.40}"
            if not re.fullmatch(r"[0-9]+/[0-9]+", shape):
                fail(path, where, "is not a grid of a top_k/vocab")
            if not (isinstance(grid, list) and len(grid) == rows and all(isinstance(r, list) and len(r) == cols
                                                                          for r in grid)):
                fail(path, where, f"is not {rows} rows (depths) of {cols} values (tree sizes)")
            for row in grid:
                for value in row:
                    check_value(value, path, where, "nonneg")
