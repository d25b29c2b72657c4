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
