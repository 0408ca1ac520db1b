"""The package as users install it: the wheel built from the tracked files, installed (not editable) in a
fresh venv, used from a directory outside the checkout: imports, the notebook call, the console command's
help and generate, the shipped head and data found inside the installed package, the dashboard's health.

Offline and quick: the wheel is built with this interpreter's setuptools (no build isolation), installed
with --no-deps --no-index, and the venv sees this environment's dependencies through a .pth file of plain
paths (a path .pth does not run the .pth files it names, so this environment's editable install of the
checkout stays off)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eagle", "analysis", "app")
TIMEOUT = 240  # per subprocess: the first model load of a run converts the GGUF (~30 s)


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the wheel test copies the checkout's tracked files: needs git and a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def _run(cmd: list[str | Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the tracked files (a build writes build/ and *.egg-info into its source)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in _tracked_files():
        if not name.startswith("data/"):  # 46 MB of training data and old heads, outside every package
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "--disable-pip-version-check", "-w", dist, src], cwd=dist)
    return next(dist.glob("eagle2_explorer-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed, then this environment's dependencies on its path."""
    env = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", env], cwd=env)
    python = env / "bin" / "python"
    # pip installs before the .pth exists: it must not see (and replace) this environment's editable copy
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
          "--disable-pip-version-check", wheel], cwd=env)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_dependencies.pth").write_text("".join(f"{p}\n" for p in ours), encoding="utf-8")
    return env


@pytest.mark.slow
def test_the_wheel_holds_every_tracked_file_of_the_packages_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = {f for f in _tracked_files() if f.split("/")[0] in PACKAGES}
    assert sorted(tracked - names) == []  # a module, a page script, a head's weights, a data file
    tops = {n.split("/")[0] for n in names} - set(PACKAGES)  # no tests/, scripts/ or data/
    assert len(tops) == 1 and tops.pop().endswith(".dist-info")
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert b"eagle2-explorer = eagle.cli:main" in entry_points


# Run by the installed interpreter from outside the checkout: prints where everything came from.
IMPORTS = """
import json, analysis, app, app.state, eagle, eagle.tools.bench.command, eagle.training.commands
from eagle import explore
from eagle.models.headio import shipped_head_path
from eagle.records.questions import load_questions
from eagle.core.tree import DEFAULT_STATIC_TREE
r = explore("Say hi.", max_new_tokens=3, dtype="float32", budget="fixed")
print(json.dumps({"modules": [m.__file__ for m in (analysis, app, app.state, eagle, eagle.tools.bench.command)],
                  "head": str(shipped_head_path("smollm2-135m-instruct")), "explore_head": r.head_source,
                  "tokens": len(r.generation.tokens), "questions": len(load_questions("mt_bench")[0]),
                  "static_tree": str(DEFAULT_STATIC_TREE), "tree_exists": DEFAULT_STATIC_TREE.is_file()}))
"""


@pytest.mark.slow
def test_the_installed_package_runs_from_another_directory(venv, tmp_path):
    site = str(venv.resolve())
    got = json.loads(_run([venv / "bin" / "python", "-c", IMPORTS], tmp_path).stdout.strip().splitlines()[-1])
    assert all(m.startswith(site) for m in got["modules"]), got["modules"]
    assert got["head"].startswith(site) and got["explore_head"] == got["head"]
    assert got["static_tree"].startswith(site) and got["tree_exists"]
    assert got["tokens"] == 3 and got["questions"] == 80
    command = venv / "bin" / "eagle2-explorer"
    assert re.search(r"\bapp\b.*dashboard", _run([command, "--help"], tmp_path).stdout, re.S)
    out = _run([command, "generate", "--prompt", "Say hi.", "--max-new-tokens", "3", "--dtype", "float32",
                "--budget", "fixed", "--json"], tmp_path).stdout
    assert json.loads(out.strip().splitlines()[-1])["head"] == got["head"]


@pytest.mark.slow
def test_the_installed_dashboard_command_serves(venv, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_live", ROOT / "scripts" / "bench_live.py")
    bench_live = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_live", bench_live)  # its dataclasses look their module up while defined
    spec.loader.exec_module(bench_live)
    launcher = [str(venv / "bin" / "eagle2-explorer"), "app"]
    with bench_live.streamlit_server(tmp_path / "streamlit.log", launcher, cwd=tmp_path) as url:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=10) as r:
            assert r.read().strip() == b"ok"


def _pins(path: Path) -> dict[str, Requirement]:
    lines = (line.split("#")[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {canonicalize_name(r.name): r for r in map(Requirement, filter(None, lines))}


def test_dependencies_admit_the_versions_setup_installs():
    """Every package requirements.txt pins is declared (a runtime dependency or a test extra) with a range
    that admits the pinned version; the --no-deps data packages are not dependencies."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {canonicalize_name(r.name): r for r in map(Requirement, [*project["dependencies"],
                                                                         *project["optional-dependencies"]["test"]])}
    pinned = _pins(ROOT / "requirements.txt")
    assert sorted(pinned.keys() - declared.keys()) == []
    for name, pin in pinned.items():
        version = next(iter(pin.specifier)).version
        assert declared[name].specifier.contains(version), f"{declared[name]} refuses requirements.txt's {pin}"
    assert "accelerate" in declared and declared["torch"].specifier.contains("2.13.0+cpu")
    assert not _pins(ROOT / "requirements-nodeps.txt").keys() & declared.keys()
