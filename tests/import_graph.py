"""The import graph of KVBench's own modules, read from the source (AST): every import, also those
under ``if TYPE_CHECKING:`` and inside functions, so an annotation-only import counts as an edge."""

from __future__ import annotations

import ast
from pathlib import Path

#: The top-level packages of the repository (docs/design.md, "Layout").
PACKAGES = ("methods", "runners", "reports", "tasks", "kernels")


def modules(repo: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under :data:`PACKAGES` (a package is its
    ``__init__.py``)."""
    found = {}
    for root in PACKAGES:
        for path in (repo / root).rglob("*.py"):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_graph(repo: Path) -> dict[str, set[str]]:
    """Module -> the modules of :func:`modules` it imports (``from a import b`` is an edge to the
    submodule ``a.b`` where there is one, else to ``a``; relative imports resolved)."""
    found = modules(repo)
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    head = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*head, base] if base else head)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in found:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def package_graph(repo: Path) -> dict[str, set[str]]:
    """Package -> the packages its own modules import. A package importing its own subpackages
    (``methods/__init__.py`` registering ``methods.keepkv``) holds them, and is no edge."""
    found = modules(repo)

    def package(name: str) -> str:
        return name if found[name].name == "__init__.py" else name.rpartition(".")[0]

    graph: dict[str, set[str]] = {}
    for name, targets in module_graph(repo).items():
        for target in targets:
            a, b = package(name), package(target)
            graph.setdefault(a, set()), graph.setdefault(b, set())
            if a != b and not b.startswith(f"{a}."):
                graph[a].add(b)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
