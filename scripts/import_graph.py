"""The project's import graph from the code (every import statement, at any depth), its cycles, and
imports that run against the layers, lowest first: eagle records -> models -> core -> tools -> training
-> the entry points (eagle's CLI, notebook API and facade) -> analysis -> app (LAYERS below).

    python scripts/import_graph.py [--dot FILE]

Prints each layer's module count; exits 1 when it finds a cycle, an upward import or a module in no
layer (a new module at eagle/'s root), so CI can keep the architecture as drawn."""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eagle", "analysis", "app")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = here.split(".") if is_package else here.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" for a in node.names] + [base]


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Project modules imported anywhere in the file (function-level imports included)."""
    here, tree = module_name(path), ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            _resolve(node, here, path.name == "__init__.py") if isinstance(node, ast.ImportFrom) else []
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != here:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) for p in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


# The layers, lowest first; a module may import its own layer and those below. eagle/'s folders are
# its layers; at eagle/'s root only the entry points (and the tables they hand out) sit, at the top.
LAYERS = (
    ("records", ("eagle.records", "eagle.resources")),  # traces, file checks, atomic writes, rates
    ("models", ("eagle.models",)),  # target, draft heads, their checkpoints, the KV cache
    ("core", ("eagle.core",)),  # the decoder
    ("tools", ("eagle.tools",)),  # settings, Session, bench, budget, profile, exports
    ("training", ("eagle.training",)),
    ("entry", ("eagle.cli", "eagle.__main__", "eagle.notebook", "eagle.frames", "eagle")),  # CLI, notebook API
    ("analysis", ("analysis",)),
    ("app", ("app",)),
)
NAMES = tuple(name for name, _ in LAYERS)


def layer(module: str) -> int | None:
    """The module's layer (an index of LAYERS; higher may import lower), None where it has none."""
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (module.startswith(p + ".") and p != "eagle") for p in prefixes):
            return rank
    return None


def unplaced(g: dict[str, set[str]]) -> list[str]:
    """Modules outside every layer: a new module at eagle/'s root must join a layer's folder."""
    return sorted(m for m in g if layer(m) is None)


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, deps in g.items() for b in deps
                  if None not in (layer(a), layer(b)) and layer(b) > layer(a))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dot", help="also write the graph in Graphviz dot format")
    args = p.parse_args()
    g = graph()
    if args.dot:
        lines = [f'  "{a}" -> "{b}";' for a in sorted(g) for b in sorted(g[a])]
        Path(args.dot).write_text("digraph imports {\n" + "\n".join(lines) + "\n}\n", encoding="utf-8")
    found, up, lost = cycles(g), upward(g), unplaced(g)
    for rank, name in enumerate(NAMES):
        print(f"{rank} {name}: {sum(layer(m) == rank for m in g)} modules")
    for comp in found:
        print("cycle:", " <-> ".join(comp))
    for a, b in up:
        print(f"upward import: {a} ({NAMES[layer(a)]}) -> {b} ({NAMES[layer(b)]})")
    for m in lost:
        print(f"in no layer: {m}")
    print(f"{len(g)} modules, {sum(map(len, g.values()))} imports, {len(found)} cycles, {len(up)} upward imports, "
          f"{len(lost)} outside the layers")
    return 1 if found or up or lost else 0


if __name__ == "__main__":
    sys.exit(main())
