"""Loading trace directories and writing figures (PNG/SVG/PDF through kaleido + a local Chromium, or
HTML when no browser is installed) and tables (CSV + Markdown) to disk."""
from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from eagle.records.files import WriteError, atomic_write, error_sentence
from eagle.records.markdown import markdown_table
from eagle.records.trace import Trace, TraceFormatError, read_trace

# Kaleido 1.x drives a Chrome-family browser; these are the names Debian/Ubuntu/Chrome install.
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
STATIC_FORMATS = ("png", "svg", "pdf", "jpeg", "webp")
INSTALL_HINT = ("static export needs a Chrome/Chromium for kaleido: `apt-get install -y chromium` "
                "(or set BROWSER_PATH to a Chrome binary)")


@dataclass
class ExportResult:
    written: list[Path] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def trace_files(path: Path) -> list[Path]:
    """A .jsonl file; a directory's *.jsonl (sorted, not recursive); or, for an `eagle bench --out`
    directory (its traces sit in traces/), that traces/ folder's *.jsonl."""
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("*.jsonl"))
    return files or sorted((path / "traces").glob("*.jsonl"))


def load_traces(path: str | Path) -> tuple[list[Trace], list[str]]:
    """Every trace in the files trace_files finds, and one message per problem of a file: skipped lines,
    dropped (mixed) traces, interrupted generations, or a file that could not be read at all."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no trace file or directory at {path}")
    files = trace_files(path)
    traces: list[Trace] = []
    messages: list[str] = []
    for file in files:
        try:
            found, report = read_trace(file)
        except (TraceFormatError, OSError, UnicodeError) as err:
            messages.append(f"{file}: skipped, not a readable trace ({err})")
            continue
        traces += found
        messages += report.messages(file)
    return traces, messages


def find_browser() -> str | None:
    """BROWSER_PATH when it names a file, else the first Chrome-family browser on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).is_file():
        return env
    return next((p for p in map(shutil.which, BROWSER_NAMES) if p), None)


def _size(fig: go.Figure) -> tuple[int, int]:
    return int(fig.layout.width or 1200), int(fig.layout.height or 700)


# Paper widths (inches) of a journal or conference page's one and two columns.
PAPER_WIDTHS = {"one column (3.5 in)": 3.5, "two columns (7 in)": 7.0}
PX_PER_IN, PT_PER_PX = 96, 0.75  # the browser's CSS pixel: kaleido's PDF is 0.75 pt per layout pixel
# A paper figure is laid out at 1.5x its printed size and drawn at 2/3: the layouts' 18 px text prints at
# 9 pt, the usual caption size, and the 13 px tree labels at 6.5 pt.
PAPER_DRAW = 2 / 3
PAPER_DPI = 300  # PNG at paper size


@dataclass(frozen=True)
class PaperSize:
    """How to lay out and draw a figure `inches` wide: the layout width in px and the scales that make
    vector output (SVG in CSS px, PDF in pt) and PNG (at PAPER_DPI) exactly that wide."""
    inches: float

    @property
    def layout_width(self) -> int:
        return round(self.inches * PX_PER_IN / PAPER_DRAW)

    def scale(self, fmt: str) -> float:
        if fmt in ("png", "jpeg", "webp"):
            return self.inches * PAPER_DPI / self.layout_width
        return PAPER_DRAW

    def fit(self, fig: go.Figure) -> go.Figure:
        """A copy at the layout width; the height follows the aspect ratio, but not below 60 % of the
        original (a 1200 x 700 figure squeezed to 504 x 294 has no room for its 18 px text)."""
        width, height = _size(fig)
        ratio = self.layout_width / width
        return go.Figure(fig).update_layout(width=self.layout_width, height=round(height * max(ratio, 0.6)))


def check_formats(text: str) -> tuple[str, ...]:
    """--formats as a tuple of STATIC_FORMATS (empty: tables only); one sentence naming the bad ones."""
    formats = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in STATIC_FORMATS]
    if bad:
        raise ValueError(f"--formats {text!r}: choose from {', '.join(STATIC_FORMATS)} (comma-separated)")
    return formats


def write_figures(figs: dict[str, go.Figure], out: str | Path, formats: tuple[str, ...] = ("png", "svg"),
                  scale: float = 1.0, paper: PaperSize | None = None) -> ExportResult:
    """Write each figure as NAME.FORMAT at its layout's size (times `scale` for raster formats), or,
    with `paper`, exactly paper.inches wide (a figure whose layout depends on its width, like the tree,
    should be built at paper.layout_width first). PDF embeds its fonts (subsets, by Chromium); SVG names
    them (Liberation Sans, then Arial). Without a browser, or if the browser fails, write NAME.html
    instead and say why."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bad = [f for f in formats if f not in STATIC_FORMATS]
    if bad:
        raise ValueError(f"unsupported figure format(s) {bad}; choose from {', '.join(STATIC_FORMATS)}")
    if not formats:  # tables only: no browser to start
        return ExportResult()
    browser = find_browser()
    if browser is None:
        return _write_html(figs, out, f"no browser found: {INSTALL_HINT}; wrote HTML instead")
    # kaleido writes each image itself: to a temporary name, renamed once the batch is through (eagle.records.files'
    # rule: no half-written figure under the real name)
    jobs = [_job(name, fig, fmt, out, scale, paper) for name, fig in figs.items() for fmt in formats]
    for job in jobs:  # a stale file from an earlier run must not pass for a fresh one
        job["final"].unlink(missing_ok=True)
    errors = _render(jobs, browser)
    _keep_images(jobs, errors, out)
    result = ExportResult(written=[j["final"] for j in jobs if _nonempty(j["final"])])
    failed = {name: fig for name, fig in figs.items()
              if not all(_nonempty(out / f"{name}.{fmt}") for fmt in formats)}
    if failed:
        why = "; ".join(f"{type(e).__name__}: {e}" for e in errors)[:300] or "no output"
        fallback = _write_html(failed, out, f"static export of {', '.join(failed)} failed with {browser} "
                                            f"({why}); wrote HTML for those instead")
        result.written += fallback.written
        result.messages += fallback.messages
    return result


def _job(name: str, fig: go.Figure, fmt: str, out: Path, scale: float, paper: PaperSize | None) -> dict:
    if paper is not None:
        fig = paper.fit(fig) if _size(fig)[0] != paper.layout_width else fig
        scale = paper.scale(fmt)
    elif fmt not in ("png", "jpeg", "webp"):
        scale = 1
    width, height = _size(fig)
    return {"fig": fig, "path": out / f".{name}.{fmt}.{os.getpid()}.tmp", "final": out / f"{name}.{fmt}",
            "opts": {"format": fmt, "width": width, "height": height, "scale": scale}}


def _render(jobs: list[dict], browser: str) -> list[BaseException]:
    """Render every job, then once more, in a fresh browser, the ones that came back empty: headless
    Chromium now and then fails one render under load (a JavascriptError "Uncaught") and renders it on
    the next launch. A failed file write is not retried: a full disk stays full. Returns the errors of
    the last attempt."""
    errors = _kaleido_write(jobs, browser)
    missing = [j for j in jobs if not _nonempty(j["path"])]
    if not missing or any(isinstance(e, OSError) for e in errors):
        return errors
    return _kaleido_write(missing, browser)


def _kaleido_write(jobs: list[dict], browser: str) -> list[BaseException]:
    """Render every job with one browser launch. MathJax is off: its default comes from a CDN, and
    this must work offline."""
    import kaleido  # deferred: importing kaleido is slow and only export needs it
    from choreographer.errors import ChromeNotFoundError

    try:
        errors = kaleido.write_fig_from_object_sync([{k: j[k] for k in ("fig", "path", "opts")} for j in jobs],
                                                    kopts={"path": browser, "mathjax": False})
    except (ChromeNotFoundError, OSError, RuntimeError, TimeoutError, ValueError) as err:
        return [err]
    return list(errors or ())


def _keep_images(jobs: list[dict], errors: list[BaseException], out: Path) -> None:
    """Rename the images kaleido wrote to their names. A failed file write (a full disk) may have left a
    partial image that looks whole: then none is kept, and the error names the directory."""
    failed_write = next((e for e in errors if isinstance(e, OSError)), None)
    for job in jobs:
        if failed_write is None and _nonempty(job["path"]):
            os.replace(job["path"], job["final"])
        job["path"].unlink(missing_ok=True)
    if failed_write is not None:
        why = getattr(failed_write, "strerror", None) or error_sentence(failed_write)
        raise WriteError(f"could not write the figures in {out}: {why}")


def _nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def _write_html(figs: dict[str, go.Figure], out: Path, message: str) -> ExportResult:
    """Interactive fallback; plotly.js is written once next to the pages so they open offline."""
    from plotly.offline import get_plotlyjs
    written = []
    if not _nonempty(out / "plotly.min.js"):  # what include_plotlyjs="directory" pages load
        atomic_write(out / "plotly.min.js", get_plotlyjs())
    for name, fig in figs.items():
        path = out / f"{name}.html"
        atomic_write(path, fig.to_html(include_plotlyjs="directory", full_html=True))
        written.append(path)
    return ExportResult(written=written, messages=[message])


# ---- tables ---------------------------------------------------------------------------------------
def _cell(value: object, floatfmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else format(value, floatfmt)
    return str(value)


def to_markdown(frame: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A GitHub-flavoured Markdown table (eagle.records.markdown; pandas' own needs `tabulate`, not installed)."""
    rows = ([_cell(v, floatfmt) for v in row] for row in frame.itertuples(index=False))
    right = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    return markdown_table([str(c) for c in frame.columns], rows, right) + "\n"


def write_tables(tables: dict[str, pd.DataFrame], out: str | Path, markdown: bool = True) -> list[Path]:
    """NAME.csv for every table, and NAME.md next to it when `markdown`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():  # atomically (eagle.records.files): a full disk leaves no empty CSV
        atomic_write(out / f"{name}.csv", frame.to_csv(index=False))
        written.append(out / f"{name}.csv")
        if markdown:
            atomic_write(out / f"{name}.md", to_markdown(frame))
            written.append(out / f"{name}.md")
    return written
