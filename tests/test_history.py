"""app.history: the dashboard's run history on disk, without Streamlit or a model. Several processes
hammer one store at once; nothing is lost, nothing dangles, the database stays whole."""
from __future__ import annotations

import multiprocessing
import sqlite3
from dataclasses import replace

import pytest

from app.history import ENV, HistoryError, RunStore, default_path
from eagle.records.trace import TraceHeader
from tests.test_analysis import one_child_steps, trace

WORKERS, RUNS = 4, 12


def run(prompt: str, mode: str = "dynamic"):
    t = trace(one_child_steps(0.7, 3, 2, mode), mode)
    t.header = replace(t.header, prompt=prompt, generation=TraceHeader("m", None, {}, "", 0).generation)
    t.header.meta["finished"] = "eos"
    return t


def test_runs_are_kept_named_searchable_reloadable_and_deletable(tmp_path) -> None:
    store = RunStore(tmp_path / "runs.sqlite3")
    first = store.add(run("Explain KV caching 🙂\nin two lines."))
    second = store.add(run("Write a haiku.", "static"), name="haiku")
    again = RunStore(tmp_path / "runs.sqlite3")  # a restart: a new store on the same file
    assert [r.name for r in again.runs()] == ["haiku", "Explain KV caching 🙂 (dynamic)"]
    assert [r.id for r in again.runs("KV")] == [first] and [r.id for r in again.runs("static")] == [second]
    loaded = again.load(first)
    assert loaded.header.prompt == "Explain KV caching 🙂\nin two lines." and len(loaded.steps) == 4
    assert again.runs("haiku")[0].settings["mode"] == "static" and again.runs("KV")[0].tau > 1
    again.rename(first, "kv")
    store.add(loaded)  # kept again (a rerun of the same generation): the user's name stays
    assert {r.name for r in store.runs()} == {"kv", "haiku"}
    store.delete(second)
    assert [r.id for r in store.runs()] == [first] and not (tmp_path / "traces" / f"{second}.jsonl").exists()
    with pytest.raises(HistoryError, match="cannot be empty"):
        store.rename(first, " ")
    with pytest.raises(HistoryError, match="could not be read"):
        store.load(second)


def test_the_store_lives_under_the_cache_or_where_the_variable_says(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path / "cache"))
    assert default_path() == tmp_path / "cache" / "history" / "runs.sqlite3"
    monkeypatch.setenv(ENV, str(tmp_path / "lab.sqlite3"))
    assert RunStore().path == tmp_path / "lab.sqlite3"


def test_a_broken_database_is_one_sentence(tmp_path) -> None:
    path = tmp_path / "runs.sqlite3"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(HistoryError, match="could not be used"):
        RunStore(path).runs()


def _hammer(path: str, worker: int) -> list[str]:
    """Add RUNS runs, rename some, delete every third, searching as it goes: what it should leave."""
    store = RunStore(path)
    kept = []
    for i in range(RUNS):
        run_id = store.add(run(f"worker {worker} run {i}"))
        store.runs("worker")
        if i % 3 == 2:
            store.delete(run_id)
        else:
            store.rename(run_id, f"w{worker}-{i}")
            kept.append(run_id)
    return kept


def test_several_processes_hammering_one_store_lose_nothing(tmp_path) -> None:
    path = str(tmp_path / "runs.sqlite3")
    RunStore(path).runs()  # create it first, as a running server would have
    with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
        expected = pool.starmap(_hammer, [(path, w) for w in range(WORKERS)])
    store = RunStore(path)
    runs = store.runs(limit=10_000)
    assert sorted(r.id for r in runs) == sorted(i for ids in expected for i in ids)
    assert all(r.name.startswith("w") for r in runs)
    for r in runs:
        assert store.load(r.id).header.generation == r.id
    files = {p.stem for p in (tmp_path / "traces").glob("*.jsonl")}
    assert files == {r.id for r in runs}  # no dangling row, no orphan file
    assert not list((tmp_path / "traces").glob(".*.tmp"))  # no half-written file left behind
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
