"""`python -m analysis figures --traces DIR_OR_FILE --out DIR`: every paper figure (PNG + SVG by
default) and table (CSV + Markdown) from recorded traces."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle.checks import ArgumentParser, check_ranges
from eagle.files import run_guarded

from .export import check_formats, load_traces, write_figures, write_tables
from .report import build_figures, build_tables
from .tables import nodes_frame, steps_frame, trace_seconds


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m analysis", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    fig = sub.add_parser("figures", help="write every figure and table for a set of traces")
    fig.add_argument("--traces", required=True, type=Path, help="a .jsonl trace file, a directory of them, or an `eagle bench` output directory")
    fig.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    fig.add_argument("--bins", type=int, default=10, help="calibration bins (default 10)")
    fig.add_argument("--formats", default="png,svg", help="comma-separated: png, svg, pdf (default png,svg)")
    fig.add_argument("--scale", type=float, default=1.0, help="raster scale factor (1 = 1200 px wide)")
    return parser


def figures_command(args: argparse.Namespace) -> int:
    check_ranges(args)  # --bins, --scale: before anything is read or written
    formats = check_formats(args.formats)
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file, not a directory: give a directory for the figures.")
    traces, messages = load_traces(args.traces)
    for message in messages:
        print(f"warning: {message}", file=sys.stderr)
    if not traces:
        raise ValueError(f"no readable trace in {args.traces}")
    nodes, steps = nodes_frame(traces), steps_frame(traces)
    tables = build_tables(nodes, steps, args.bins, trace_seconds(traces))
    written = write_tables(tables, args.out)
    written += write_tables({"nodes": nodes, "steps": steps}, args.out, markdown=False)
    result = write_figures(build_figures(traces, nodes, steps, args.bins), args.out, formats, args.scale)
    for message in result.messages:
        print(f"warning: {message}", file=sys.stderr)
    print(f"{len(traces)} trace(s), {len(steps)} steps, {len(nodes)} drafted nodes -> "
          f"{len(written) + len(result.written)} files in {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_guarded(lambda: figures_command(_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
