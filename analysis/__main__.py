"""`python -m analysis figures --traces DIR_OR_FILE --out DIR`: every paper figure (PNG + SVG by
default) and table (CSV + Markdown) from recorded traces. `python -m analysis ablation --results
ablation.json --out DIR`: the recipe ablation's figure and table (`python -m eagle ablation`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle.tools.checks import ArgumentParser, check_ranges
from eagle.records.files import atomic_write, run_guarded

from .ablation import ablation_figure, ablation_frame, ablation_markdown, load_ablation
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
    abl = sub.add_parser("ablation", help="the recipe ablation's figure and table from `eagle ablation`")
    abl.add_argument("--results", required=True, type=Path, help="the ablation.json `python -m eagle ablation` wrote")
    abl.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    abl.add_argument("--formats", default="png,svg", help="comma-separated: png, svg, pdf (default png,svg)")
    return parser


def ablation_command(args: argparse.Namespace) -> int:
    """ablation.{png,svg,...} (HTML without a browser), ablation.csv and ablation.md (the TRAINING.md table)."""
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file, not a directory: give a directory for the figure.")
    formats = check_formats(args.formats)
    results = load_ablation(args.results)
    result = write_figures({"ablation": ablation_figure(results)}, args.out, formats)
    written = write_tables({"ablation": ablation_frame(results)}, args.out, markdown=False)
    atomic_write(args.out / "ablation.md", ablation_markdown(results))
    for message in result.messages:
        print(f"warning: {message}", file=sys.stderr)
    print(f"{len(results['points'])} point(s) -> {len(result.written) + len(written) + 1} files in {args.out}")
    return 0


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
    def run() -> int:  # parsed inside the error boundary: a bad flag is one sentence too
        args = _parser().parse_args(argv)
        return {"figures": figures_command, "ablation": ablation_command}[args.command](args)
    return run_guarded(run)


if __name__ == "__main__":
    sys.exit(main())
