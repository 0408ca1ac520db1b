"""The architecture as drawn: no import cycle, no import running up the layers (eagle records ->
models -> core -> tools -> training -> the entry points -> analysis -> app) and no module outside them
(scripts/import_graph.py)."""
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
    assert {"eagle.core.decode", "eagle.tools.session", "analysis.figures", "app.live"} <= set(g)  # it read the tree
    assert ig.cycles(g) == []
    assert ig.upward(g) == []
    assert ig.unplaced(g) == []


def test_eagles_folders_are_its_layers_in_order() -> None:
    ig = _graph_module()
    order = ["eagle.records.trace", "eagle.models.target", "eagle.core.decode", "eagle.tools.session",
             "eagle.training.train", "eagle.cli", "analysis.figures", "app.live"]
    assert [ig.layer(m) for m in order] == list(range(len(order)))
    assert ig.layer("eagle.resources") == ig.layer("eagle.records.files")
    assert ig.layer("eagle") == ig.layer("eagle.notebook") == ig.layer("eagle.frames")


def test_the_checker_sees_a_cycle_an_upward_import_and_a_stray_module() -> None:
    ig = _graph_module()
    g = {"eagle.core.a": {"eagle.core.b"}, "eagle.core.b": {"eagle.core.a"},
         "eagle.core.decode": {"analysis.figures"}, "eagle.models.head": {"eagle.core.tree"},
         "analysis.figures": set(), "eagle.core.tree": set(), "eagle.helpers": set()}
    assert ig.cycles(g) == [["eagle.core.a", "eagle.core.b"]]
    assert ig.upward(g) == [("eagle.core.decode", "analysis.figures"), ("eagle.models.head", "eagle.core.tree")]
    assert ig.unplaced(g) == ["eagle.helpers"]


def test_readmes_module_map_names_every_module_and_folder_of_eagle() -> None:
    """README's map (How it works) names each module and folder of eagle/, and nothing that is not there."""
    import re
    root = SCRIPT.parent.parent
    text = (root / "README.md").read_text(encoding="utf-8").split("## How it works", 1)[1]
    block = text.split("```", 2)[1]
    listing = block[block.index("\neagle/ "):]
    named = set(re.findall(r"(?<![/\w])([a-z0-9_]+\.py)\b", listing))  # not scripts/...
    modules = {p.name for p in (root / "eagle").rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert named == modules
    folders = {p.name for p in (root / "eagle").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    folders |= {p.name for p in (root / "eagle" / "tools").iterdir() if (p / "__init__.py").is_file()}
    assert folders <= set(re.findall(r"\b([a-z]+)/", listing))
