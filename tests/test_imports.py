"""The layers and the import graph: tasks/ imports nothing from runners/, reports/ only the result
store (``runners.results``, which imports nothing else of runners/ and no torch), and no module or
package imports itself back through others, not even through an annotation-only import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.import_graph import cycles, module_graph, package_graph

#: What each layer may import from runners/: tasks nothing, reports and the store the store alone.
ALLOWED_FROM_RUNNERS = {"tasks": (), "reports": ("runners.results",), "runners/results": ("runners.results",)}


@pytest.mark.parametrize("layer", sorted(ALLOWED_FROM_RUNNERS))
def test_layers_import_only_the_result_store_from_runners(layer):
    allowed = ALLOWED_FROM_RUNNERS[layer]
    graph = module_graph(REPO)
    prefix = layer.replace("/", ".")
    offenders = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name == prefix or name.startswith(f"{prefix}.")
        for target in targets
        if target.startswith("runners")
        and not any(target == a or target.startswith(f"{a}.") for a in allowed)
    ]
    assert not offenders, offenders


def test_no_module_imports_itself_back():
    assert cycles(module_graph(REPO)) == []


def test_no_package_imports_itself_back():
    assert cycles(package_graph(REPO)) == []


def test_the_graph_sees_annotation_only_and_relative_imports(tmp_path):
    """The checks can fail: a cycle closed by an import under ``TYPE_CHECKING`` is found."""
    pkg = tmp_path / "methods"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from methods.b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    assert cycles(module_graph(tmp_path)) == [["methods.a", "methods.b"]]


def test_reports_and_the_error_type_import_without_torch():
    """``python -m reports`` and its store read records without loading torch (or the tasks)."""
    code = (
        "import sys, reports.__main__, reports.frame, runners.results.store, tasks.errors, tasks.data; "
        "assert 'torch' not in sys.modules and 'tasks.base' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
