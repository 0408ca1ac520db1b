"""Where the analysis pages get traces: this session, a path typed in, or an uploaded JSONL file.
Corrupt lines are skipped by eagle.records.trace.read_trace; the page says how many, and never crashes."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from eagle.records.schema import FileFormatError
from eagle.records.trace import Trace, read_trace

from . import state
from .persist import save, seed

SOURCES = ("This session's traces", "A trace file or directory", "Upload JSONL")


@dataclass
class Loaded:
    traces: list[Trace] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # file -> lines skipped
    errors: list[str] = field(default_factory=list)  # one sentence per problem


def read_files(paths: list[Path], names: list[str] | None = None) -> Loaded:
    """Read every file, collecting traces, skipped-line counts and one-sentence errors."""
    out = Loaded()
    for path, name in zip(paths, names or [str(p) for p in paths]):
        try:
            traces, report = read_trace(path)
        except FileFormatError as err:
            out.errors.append(f"{name} is not a readable trace: {err}")
            continue
        except OSError as err:
            out.errors.append(f"Could not read {name}: {err.strerror or err}.")
            continue
        out.traces += traces
        if report.skipped_lines:
            out.skipped[name] = report.skipped_lines
    return out


def from_path(text: str) -> Loaded:
    path = Path(text).expanduser()
    if path.is_dir():
        files = sorted(path.rglob("*.jsonl"))
        if not files:
            return Loaded(errors=[f"{path} holds no .jsonl trace files."])
        return read_files(files)
    if path.is_file():
        return read_files([path])
    return Loaded(errors=[f"{path} does not exist."])


def from_uploads(uploads: list) -> Loaded:
    """read_trace wants a path: spill each upload to a temporary file first."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, up in enumerate(uploads):
            p = Path(tmp) / f"{i}.jsonl"
            p.write_bytes(up.getvalue())
            paths.append(p)
        return read_files(paths, [up.name for up in uploads])


def pick_traces(prefix: str) -> list[Trace]:
    """The source widgets; reports skipped lines and errors, returns whatever could be read."""
    seed(f"{prefix}_source", SOURCES[0])
    source = st.radio("Traces", SOURCES, horizontal=True, key=f"{prefix}_source")
    save(f"{prefix}_source")
    if source == SOURCES[0]:
        loaded = Loaded(traces=pick_runs(prefix))
    elif source == SOURCES[1]:
        seed(f"{prefix}_path", "")
        text = st.text_input("Path to a .jsonl trace file or a directory of them", key=f"{prefix}_path")
        save(f"{prefix}_path")
        loaded = from_path(text) if text.strip() else Loaded()
    else:
        ups = st.file_uploader("Trace files (JSONL)", type=["jsonl", "json", "txt"],
                               accept_multiple_files=True, key=f"{prefix}_upload")
        loaded = from_uploads(ups) if ups else Loaded()
    report(loaded)
    return loaded.traces


def pick_runs(prefix: str) -> list[Trace]:
    """This session's runs, newest last, with a picker (all of them unless the user narrows it).
    The picker stores run numbers, so a new run does not silently change what is selected."""
    runs = state.session_traces()
    if not runs:
        st.info("No traces yet in this session: generate some on the Live explorer or Static vs "
                "dynamic page, or load a file.")
        return []
    key, everything = f"{prefix}_runs", list(range(len(runs)))
    seed(key, everything)
    seen = st.session_state.get(f"{prefix}_runs_seen", 0)
    kept = [i for i in st.session_state[key] if i < len(runs)]
    # "All runs" stays all runs when new ones arrive; a narrowed choice stays as the user left it.
    st.session_state[key] = everything if kept == list(range(seen)) else kept
    st.session_state[f"{prefix}_runs_seen"] = len(runs)
    chosen = st.multiselect("Runs of this session", everything, key=key,
                            format_func=lambda i: state.run_label(i, runs[i]),
                            help="Every finished or stopped generation of this browser session")
    save(key)
    return [runs[i] for i in chosen]


def report(loaded: Loaded) -> None:
    for err in loaded.errors:
        st.error(err)
    if loaded.skipped:
        total = sum(loaded.skipped.values())
        detail = ", ".join(f"{name}: {n}" for name, n in loaded.skipped.items())
        st.warning(f"Skipped {total} corrupt line(s) while reading ({detail}).")
    if loaded.traces:
        st.caption(f"{len(loaded.traces)} trace(s), {sum(len(t.steps) for t in loaded.traces)} rounds.")


ALL = "all"


def head_name(trace: Trace) -> str:
    """The head a trace was drafted with, as the filter lists it (vanilla traces have none)."""
    return trace.header.head or "no head (vanilla)"


def filter_traces(traces: list[Trace], prefix: str) -> list[Trace]:
    """Mode and head filters over the picked traces: calibration pooled over static and dynamic trees,
    or over two heads, would average two different predictors."""
    c1, c2 = st.columns(2)
    modes = sorted({t.header.config.get("mode", "?") for t in traces})
    heads = sorted({head_name(t) for t in traces})
    mode = c1.selectbox("Mode", [ALL, *modes], key=f"{prefix}_mode_filter",
                        help="static: EAGLE-1's fixed tree; dynamic: EAGLE-2's reranked tree")
    head = c2.selectbox("Draft head", [ALL, *heads], key=f"{prefix}_head_filter")
    return [t for t in traces if mode in (ALL, t.header.config.get("mode", "?"))
            and head in (ALL, head_name(t))]


def chosen_traces(prefix: str) -> list[Trace]:
    """The analysis pages' traces: picked (pick_traces), then narrowed by mode and head
    (filter_traces); says so when the filters leave none. Empty means the page has nothing to draw."""
    traces = pick_traces(prefix)
    if not traces:
        return []
    traces = filter_traces(traces, prefix)
    if not traces:
        st.info("No trace matches this mode and head.")
    return traces
