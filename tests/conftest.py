"""Shared fixtures: the real default model is loaded once per test session.

The suite is hermetic: every run gets its own model and cost cache (EAGLE_CACHE) in a temporary
directory, shared by the run's xdist workers and by every CLI or Streamlit subprocess they start
(through the environment), and removed at the end. The user's ~/.cache/eagle2-explorer holds the
converted model and the measured costs the dashboard uses; a run that changes it fails."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

pytest_plugins = ("pytester",)  # tests/test_hermetic.py runs a small pytest session of its own

# What eagle.models.location.cache_dir() falls back to without EAGLE_CACHE: the cache the suite must not touch.
USER_CACHE = Path.home() / ".cache" / "eagle2-explorer"
# The run's cache, exported by the controller before its xdist workers start (they inherit it).
RUN_CACHE_VAR = "EAGLE_TEST_CACHE"
_RUN_CACHE = pytest.StashKey[str]()
_USER_SNAPSHOT = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller made the run's cache
        cache = os.environ.get(RUN_CACHE_VAR)
        if not cache:
            raise pytest.UsageError(f"{RUN_CACHE_VAR} is not set in this xdist worker: tests/conftest.py sets it "
                                    "in the controller, before any worker starts")
    else:
        # Set here, before collection imports anything (eagle reads EAGLE_CACHE at each use); a user's own
        # EAGLE_CACHE is overridden too: it would be their real cache under another name.
        config.stash[_USER_SNAPSHOT] = snapshot(USER_CACHE)
        cache = config.stash[_RUN_CACHE] = tempfile.mkdtemp(prefix="eagle-test-cache-")
        os.environ[RUN_CACHE_VAR] = cache
    os.environ["EAGLE_CACHE"] = cache
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` runs two workers on two cores: one thread each (and in the CLIs they start),
        # or OpenMP threads spin-wait on each other.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime in ns, size) of root and of every file and directory under it; {} when it does not exist."""
    found = {}
    for path in (root, *sorted(root.rglob("*"))) if root.exists() else ():
        try:
            st = path.lstat()
        except FileNotFoundError:  # removed while we walked
            continue
        found[str(path.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return found


def cache_changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return ([f"added {p}" for p in sorted(after.keys() - before.keys())]
            + [f"removed {p}" for p in sorted(before.keys() - after.keys())]
            + [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]])


def pytest_sessionfinish(session):
    """In the controller, after every worker finished: fail the run if the user's cache changed."""
    before = session.config.stash.get(_USER_SNAPSHOT, None)
    if before is None:  # an xdist worker
        return
    changes = cache_changes(before, snapshot(USER_CACHE))
    if not changes:
        return
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    lines = [f"FAILED: the test run changed the user's cache {USER_CACHE} ({len(changes)} entries); tests must "
             "write only under EAGLE_CACHE, which tests/conftest.py points at a temporary directory. "
             "(Another process on this machine, e.g. the dashboard, a bench or another checkout's tests, "
             "may have written it too.)", *changes[:20]]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        print("\n".join(lines), file=sys.stderr)
        return
    reporter.write("\n")  # end the line of progress dots (xdist's, which the reporter does not track)
    for line in lines:
        reporter.write_line(line, red=True, bold=line is lines[0])


def pytest_unconfigure(config):
    cache = config.stash.get(_RUN_CACHE, None)
    if cache is not None:  # the controller, after its workers are gone: ~650 MB of converted model
        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session")
def target():
    # The first load converts the shipped GGUF into the run's cache (~30 s), once per run: eagle.models.target
    # converts under a file lock in the cache, so a second worker waits for the first and reuses its copy.
    from eagle.models.loader import load_target
    return load_target()


@pytest.fixture(scope="session")
def random_head(target):
    from eagle.models.head import new_head
    return new_head(target, seed=0)


@pytest.fixture(scope="session")
def trained_head(target):
    from eagle.models.headio import load_head, shipped_head_path
    path = shipped_head_path(target.name)
    if path is None:
        pytest.skip("no trained head ships for the default model yet")
    return load_head(path, target)


@pytest.fixture(scope="session")
def dashboard_budget():
    """The dashboard's default model pair and its auto tree budget, chosen as the app chooses it (the
    full grid: about 1.5 min on 2 cores), outside AppTest's per-run timeout. Once per run: the first
    worker measures while holding a lock in the run's cache; another worker, and the browser test's
    Streamlit server, then read the report from that cache."""
    from app import state
    from eagle.records.files import exclusive_lock
    from eagle.models.location import cache_dir
    spec = state.model_spec()
    with exclusive_lock(cache_dir() / ".dashboard-budget.lock", "the dashboard's auto budget", wait=True):
        return state._auto_budget(spec, 0, state._load_models(*spec))


@pytest.fixture(scope="session")
def mt_prompts():
    import json
    from eagle.resources import resource_path
    with open(resource_path("mt_bench.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


@pytest.fixture
def single_thread():
    """Tiny-model tests run on one thread: with other work on a 2-core machine, OpenMP threads
    spin-wait on each other and a tiny forward slows down fifty-fold."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
