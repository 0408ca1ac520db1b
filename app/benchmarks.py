"""The benchmark's measured speed-up of the auto budget, read from the newest `eagle bench` run
under runs/bench (summary.json), so the sidebar can put it next to auto's expectation."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle.records.schema import FileFormatError
from eagle.tools.bench.report import read_summary

# Where `eagle bench` writes by default: runs/bench under the working directory (the checkout for
# `make app`), not beside this file, which an installed wheel puts in site-packages.
BENCH_DIR = Path("runs") / "bench"
AUTO_MODES = ("dynamic:auto", "dynamic:adaptive")


@dataclass(frozen=True)
class Measured:
    speedup: float
    where: str  # which run, as the user can find it


def measured_auto_speedup(bench_dir: Path = BENCH_DIR) -> Measured | None:
    """The newest run that measured an auto (or adaptive) budget against vanilla, or None."""
    for summary in sorted(bench_dir.glob("*/summary.json"), reverse=True):
        try:
            modes = read_summary(summary)["modes"]
        except (OSError, FileFormatError):  # a run being written or a broken file: try an older one
            continue
        for mode in AUTO_MODES:
            speedup = (modes.get(mode) or {}).get("speedup")
            if speedup is not None:  # read_summary: null or a finite number
                return Measured(float(speedup), f"{mode}, runs/bench/{summary.parent.name}")
    return None
