"""The notebook API (eagle.explore) on the real default model, and the table inputs it enables."""
import subprocess
import sys

import pandas as pd
import pytest

from analysis import compare_modes, nodes_frame, steps_frame
from eagle import explore
from eagle.notebook import Explorer, default_explorer

SETTINGS = dict(max_new_tokens=12, dtype="float32", budget="fixed", total_tokens=8, depth=3, top_k=4)


@pytest.fixture(scope="module")
def explorer():
    return Explorer()


def test_explore_loads_once_and_is_lossless(explorer):
    dyn = explorer.explore("Name three primary colours.", mode="dynamic", **SETTINGS)
    again = explorer.explore("What is 2+2?", mode="dynamic", **SETTINGS)
    assert len(explorer.loaded) == 1  # the second call reused the pair
    van = explorer.explore("Name three primary colours.", mode="vanilla", **SETTINGS)
    assert len(explorer.loaded) == 2  # vanilla needs no head: its own key
    assert dyn.generation.tokens == van.generation.tokens  # greedy fp32: speculation changes no token
    assert dyn.text and dyn.text == van.text and again.text
    assert dyn.config.total_tokens == 8 and dyn.trace.header.config["depth"] == 3


def test_tables_from_an_exploration(explorer):
    r = explorer.explore("Name three primary colours.", mode="dynamic", **SETTINGS)
    nodes, steps = r.nodes(), r.steps()
    assert isinstance(nodes, pd.DataFrame) and isinstance(steps, pd.DataFrame)
    assert steps["new_tokens"].sum() == len(r.generation.tokens)
    assert r.tau == pytest.approx(steps["new_tokens"].sum() / steps["target_forwards"].sum())
    assert (steps.loc[~steps["prefill"], "tree_size"] <= 7).all()  # total_tokens counts the root
    # analysis accepts the Exploration, its Generation, its Trace, or a list mixing them
    assert nodes_frame(r).equals(nodes) and steps_frame(r.trace).equals(steps)
    assert len(nodes_frame(r.generation)) == len(nodes) and len(nodes_frame([r, r.trace])) == 2 * len(nodes)
    assert compare_modes(r)["mode"].tolist() == ["dynamic"]


def test_bad_settings_name_the_keyword(explorer):
    with pytest.raises(TypeError, match="max_tokens"):
        explorer.explore("hi", max_tokens=4)
    with pytest.raises(ValueError, match="mode"):
        explorer.explore("hi", mode="fast")
    with pytest.raises(TypeError, match="Generation"):
        nodes_frame("runs/t.jsonl")


def test_module_level_explore_uses_one_default_explorer():
    assert default_explorer() is default_explorer()
    assert callable(explore)


def test_importing_eagle_stays_light():
    code = "import sys, eagle, eagle.records.trace, eagle.core.decode; assert 'pandas' not in sys.modules, 'pandas imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
