"""The architecture as drawn: no import cycle, and no import running up the layers
app -> analysis -> CLI -> eagle tools and training -> eagle core (scripts/import_graph.py)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycle_and_no_upward_import() -> None:
    ig = _graph_module()
    g = ig.graph()
    assert {"eagle.decode", "eagle.tools.bench", "analysis.figures", "app.live"} <= set(g)  # it read the tree
    assert ig.cycles(g) == []
    assert ig.upward(g) == []


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    ig = _graph_module()
    g = {"eagle.a": {"eagle.b"}, "eagle.b": {"eagle.a"}, "eagle.decode": {"analysis.figures"},
         "analysis.figures": set()}
    assert ig.cycles(g) == [["eagle.a", "eagle.b"]]
    assert ig.upward(g) == [("eagle.decode", "analysis.figures")]
