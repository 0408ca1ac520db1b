"""Shared fixtures: the real default model is loaded once per test session."""
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` runs two workers on two cores: one thread each (and in the CLIs they start),
        # or OpenMP threads spin-wait on each other.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def target():
    from eagle.target import load_target
    return load_target()


@pytest.fixture(scope="session")
def random_head(target):
    from eagle.head import new_head
    return new_head(target, seed=0)


@pytest.fixture(scope="session")
def trained_head(target):
    from eagle.head import load_head, shipped_head_path
    path = shipped_head_path(target.name)
    if path is None:
        pytest.skip("no trained head ships for the default model yet")
    return load_head(path, target)


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
