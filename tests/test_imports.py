"""The layers: tasks/ and reports/ import nothing from runners/ (reports read the result store
without models; runners build on both)."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO


def imported_modules(path) -> list[str]:
    """Every module a file imports (``import a.b``, ``from a.b import c``; relative imports as ``.``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


@pytest.mark.parametrize("package", ["tasks", "reports"])
def test_tasks_and_reports_import_nothing_from_runners(package):
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / package).rglob("*.py"))
        for name in imported_modules(path)
        if name == "runners" or name.startswith("runners.")
    ]
    assert not offenders, offenders


def test_reports_and_the_error_type_import_without_torch():
    """``python -m reports`` and its store read records without loading torch (or the tasks)."""
    import subprocess
    import sys

    code = (
        "import sys, reports.__main__, reports.frame, reports.store, tasks.errors, tasks.data; "
        "assert 'torch' not in sys.modules and 'tasks.base' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def module_graph(package: str) -> dict[str, set[str]]:
    """The modules of ``package`` and the package modules each imports: every import, annotation-only
    (``if TYPE_CHECKING``) and function-local ones included; ``from p import m`` counts as ``p.m``
    where ``m`` is a module."""
    modules = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (REPO / package).rglob("*.py")
    }
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                edges |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                          for a in node.names}  # fmt: skip
        graph[name] = {e for e in edges if e in modules and e != name and e != package}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``, each as the modules along it (depth-first search)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_reports_has_no_import_circle_not_even_an_annotation_only_one():
    assert cycles(module_graph("reports")) == []
