"""Run history: every finished or stopped run of the dashboard, kept on disk across sessions and
restarts, named, searchable, reloadable and deletable. No Streamlit here (tests hammer it from
several processes).

Layout, under the user's cache directory (EAGLE_CACHE, as the models' cache; EAGLE_HISTORY names
another database file, e.g. for a shared lab store):
    history/runs.sqlite3        one row per run: id, name, when, prompt, mode, model, settings, tokens, tau
    history/traces/<id>.jsonl   the run's trace, as `generate --trace` writes it (eagle.records.trace)

Two tabs and two servers write it at once: a trace file is written atomically (eagle.records.files.atomic_write)
before its row is committed, so a row never points at a half-written file; the rows change inside
SQLite transactions (WAL journal, a busy timeout instead of "database is locked"), and one advisory
lock file serialises a row with its file (add, delete), so a delete never races an add of the same run."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from eagle.records.files import exclusive_lock
from eagle.records.stats import tau
from eagle.models.location import cache_dir
from eagle.records.trace import Trace, read_trace, write_trace

ENV = "EAGLE_HISTORY"
BUSY_MS = 30_000  # how long a writer waits for another's transaction before giving up
SCHEMA = """CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, created REAL NOT NULL, prompt TEXT NOT NULL,
    mode TEXT NOT NULL, model TEXT NOT NULL, settings TEXT NOT NULL, tokens INTEGER NOT NULL,
    tau REAL, finished TEXT)"""
COLUMNS = ("id", "name", "created", "prompt", "mode", "model", "settings", "tokens", "tau", "finished")


class HistoryError(Exception):
    """The store could not be read or written; the message says which file and why."""


@dataclass(frozen=True)
class Run:
    id: str
    name: str
    created: float
    prompt: str
    mode: str
    model: str
    settings: dict
    tokens: int
    tau: float | None
    finished: str | None


def default_path() -> Path:
    env = os.environ.get(ENV)
    return Path(env) if env else cache_dir() / "history" / "runs.sqlite3"


class RunStore:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.traces = self.path.parent / "traces"
        self.lock = self.path.with_name(self.path.name + ".lock")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection; its `with conn:` blocks are transactions (committed, or rolled back on error)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(sqlite3.connect(self.path, timeout=BUSY_MS / 1000)) as conn:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(SCHEMA)
                yield conn
        except sqlite3.Error as err:
            raise HistoryError(f"the run history at {self.path} could not be used ({err})") from None

    def add(self, trace: Trace, name: str | None = None) -> str:
        """Keep `trace` (a run already kept is replaced, its name kept unless a new one is given)."""
        run_id = trace.header.generation
        tokens = sum(len(s.new_tokens) for s in trace.steps)
        forwards = sum(s.target_forwards for s in trace.steps)
        row = (run_id, name or _default_name(trace), time.time(), trace.header.prompt,
               str(trace.header.config.get("mode", "?")), trace.header.model,
               json.dumps(trace.header.config, sort_keys=True), tokens,
               tau(tokens, forwards) if forwards else None, trace.header.meta.get("finished"))
        with exclusive_lock(self.lock, "the run history", wait=True):
            write_trace(self.traces / f"{run_id}.jsonl", [trace])  # the file first: a row never dangles
            with self._db() as conn, conn:
                old = conn.execute("SELECT name FROM runs WHERE id = ?", (run_id,)).fetchone()
                if old and name is None:
                    row = (row[0], old[0], *row[2:])
                conn.execute(f"INSERT OR REPLACE INTO runs VALUES ({', '.join('?' * len(COLUMNS))})", row)
        return run_id

    def runs(self, search: str = "", limit: int = 500) -> list[Run]:
        """The newest runs first; `search` matches the name, the prompt, the mode or the model."""
        like = f"%{search.strip()}%"
        with self._db() as conn:
            rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM runs WHERE name LIKE ? OR prompt LIKE ? "
                                "OR mode LIKE ? OR model LIKE ? ORDER BY created DESC LIMIT ?",
                                (like, like, like, like, limit)).fetchall()
        return [Run(*r[:6], json.loads(r[6]), *r[7:]) for r in rows]

    def load(self, run_id: str) -> Trace:
        path = self.traces / f"{run_id}.jsonl"
        try:
            traces, _ = read_trace(path)
        except OSError as err:
            raise HistoryError(f"run {run_id}'s trace {path} could not be read ({err.strerror})") from None
        if len(traces) != 1:
            raise HistoryError(f"run {run_id}'s trace {path} holds {len(traces)} generations, not one")
        return traces[0]

    def rename(self, run_id: str, name: str) -> None:
        if not name.strip():
            raise HistoryError("a run's name cannot be empty")
        with self._db() as conn, conn:
            conn.execute("UPDATE runs SET name = ? WHERE id = ?", (name.strip(), run_id))

    def delete(self, run_id: str) -> None:
        """The row first, then the file: a reader never finds a row without its trace."""
        with exclusive_lock(self.lock, "the run history", wait=True):
            with self._db() as conn, conn:
                conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            (self.traces / f"{run_id}.jsonl").unlink(missing_ok=True)


def _default_name(trace: Trace) -> str:
    """The prompt's first line, shortened, and the mode: what a user would call the run."""
    first = (trace.header.prompt.strip().splitlines() or [""])[0]
    short = first if len(first) <= 40 else first[:39] + "…"
    return f"{short} ({trace.header.config.get('mode', '?')})"
