"""The suite leaves the user's cache alone: tests/conftest.py gives every run a temporary EAGLE_CACHE,
shared by its workers and the subprocesses they start, and fails a run that changed ~/.cache/eagle2-explorer."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from eagle.models.location import cache_dir
from tests.conftest import RUN_CACHE_VAR, USER_CACHE

ROOT = Path(__file__).resolve().parent.parent
CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def test_the_cache_is_a_temporary_directory_of_this_run():
    run_cache = Path(os.environ[RUN_CACHE_VAR])
    assert cache_dir() == Path(os.environ["EAGLE_CACHE"]) == run_cache and run_cache.is_dir()
    assert run_cache.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert not run_cache.resolve().is_relative_to(USER_CACHE.resolve())
    assert not USER_CACHE.resolve().is_relative_to(run_cache.resolve())


def test_a_cli_subprocess_uses_the_same_cache():
    code = "from eagle.models.location import cache_dir; print(cache_dir())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(cache_dir())


# A session of its own (HOME is pytester's directory): one test writes the "user's cache" the way the
# cost cache did before the suite was hermetic; another only writes the run's cache.
PROBE = '''
import json
from pathlib import Path
from eagle.records.files import atomic_write_json
from eagle.models.location import cache_dir


def test_writes_the_run_cache():
    atomic_write_json(cache_dir() / "costs" / "fine.json", {"fine": True})


def test_overwrites_the_user_cache():
    user = Path.home() / ".cache" / "eagle2-explorer"
    assert cache_dir() != user
    atomic_write_json(user / "costs" / "measured.json", {"t": 2})
'''


def test_a_run_that_writes_the_user_cache_fails(pytester, monkeypatch):
    user = Path(os.environ["HOME"]) / ".cache" / "eagle2-explorer"  # pytester's HOME, not the real one
    assert user != USER_CACHE
    (user / "costs").mkdir(parents=True)
    (user / "costs" / "measured.json").write_text('{"t": 1}\n')
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_probe=PROBE)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # eagle from this checkout
    # -n 1: the check runs in the xdist controller, after its worker ran the tests (as in `make test`)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", timeout=300)
    result.assert_outcomes(passed=2)  # every test passed, yet the run fails:
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"FAILED: the test run changed the user's cache {user} (*",
                                 "changed costs", "changed costs/measured.json"])
    assert "fine.json" not in result.stdout.str()
