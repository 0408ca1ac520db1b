"""The project's import graph from the code (every import statement, at any depth), its cycles, and
imports that run against the layers app -> analysis -> eagle tools -> eagle core.

    python scripts/import_graph.py [--dot FILE]

Exits 1 when it finds a cycle or an upward import, so CI can keep the architecture as drawn."""
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


def layer(module: str) -> int:
    """0 core, 1 eagle tools and training, 2 the CLI and notebook API, 3 analysis, 4 app (higher may import lower)."""
    top = module.split(".")[0]
    if top == "app":
        return 4
    if top == "analysis":
        return 3
    # entry points: the CLI, and the notebook API with the package facade that re-exports it lazily
    if module in ("eagle.cli", "eagle.__main__", "eagle.notebook", "eagle"):
        return 2
    return 1 if module.split(".")[1:2] in (["tools"], ["training"]) else 0


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, deps in g.items() for b in deps if layer(b) > layer(a))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dot", help="also write the graph in Graphviz dot format")
    args = p.parse_args()
    g = graph()
    if args.dot:
        lines = [f'  "{a}" -> "{b}";' for a in sorted(g) for b in sorted(g[a])]
        Path(args.dot).write_text("digraph imports {\n" + "\n".join(lines) + "\n}\n", encoding="utf-8")
    found, up = cycles(g), upward(g)
    for comp in found:
        print("cycle:", " <-> ".join(comp))
    for a, b in up:
        print(f"upward import: {a} -> {b}")
    print(f"{len(g)} modules, {sum(map(len, g.values()))} imports, {len(found)} cycles, {len(up)} upward imports")
    return 1 if found or up else 0


if __name__ == "__main__":
    sys.exit(main())
