"""docs/extending.md's worked example (TOVA) is real code: executed from the document, registered,
and run through the method matrix's checks on the tiny Llama and every architecture family."""

from __future__ import annotations

import ast
import re
import sys
import types

import pytest
import torch

from methods import METHOD_REGISTRY, FullKV
from runners.generation.greedy import greedy_generate
from tests.architectures import FAMILIES, tiny_family
from tests.conftest import REPO
from tests.method_settings import NEW, PROMPT, prompt


@pytest.fixture(scope="module")
def tova(tmp_path_factory):
    text = (REPO / "docs" / "extending.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 30  # "a new method in 30 lines", imports included
    module = types.ModuleType("tova_example")  # dataclasses look the class' module up in sys.modules
    sys.modules[module.__name__] = module
    exec(compile(code, "docs/extending.md", "exec"), module.__dict__)
    cls = module.TOVA
    registered = METHOD_REGISTRY[cls.name]  # methods/tova.py: the same rule as the example
    METHOD_REGISTRY[cls.name] = cls
    yield cls
    METHOD_REGISTRY[cls.name] = registered
    del sys.modules[module.__name__]


def _code(cls: ast.ClassDef) -> str:
    """A class's statements without docstrings and signature annotations (what the code does, not how
    it is explained)."""
    body = [
        node for node in cls.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    ]
    for node in body:
        if isinstance(node, ast.FunctionDef):
            node.returns = None
            for arg in node.args.args:
                arg.annotation = None
            if ast.get_docstring(node) is not None:
                node.body = node.body[1:]
    return "\n".join(ast.unparse(node) for node in body)


def test_the_example_is_the_code_of_methods_tova():
    text = (REPO / "docs" / "extending.md").read_text()
    example = ast.parse(re.search(r"```python\n(.*?)```", text, re.S).group(1))
    source = ast.parse((REPO / "methods" / "tova.py").read_text())

    def tova(tree: ast.Module) -> ast.ClassDef:
        return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TOVA")

    assert _code(tova(example)) == _code(tova(source))


@pytest.mark.parametrize("budget", [10, 40])
def test_example_holds_its_budget_and_frees_memory(tiny_model, tova, budget):
    method = tova()
    seen = []

    def check(cache) -> None:
        seen.append(1)
        assert max(cache.n_slots) <= budget
        for layer in cache.layers:
            assert layer.store.allocated_bytes() <= (budget + 1) * 2 * 16 * (4 + 4) + (budget + 1) * 2 * (
                4 + 8 + 4
            )

    res = greedy_generate(tiny_model, prompt(0), method, budget, NEW, set(), check)
    assert len(seen) == NEW and res.kv_bytes < res.fullkv_bytes


def test_example_at_a_covering_budget_is_fullkv_and_deterministic(tiny_model, tova):
    ids = prompt(1)
    full = greedy_generate(tiny_model, ids, FullKV(), None, NEW, set()).tokens
    assert greedy_generate(tiny_model, ids, tova(), PROMPT + NEW, NEW, set()).tokens == full
    runs = [greedy_generate(tiny_model, prompt(2), tova(recent=2), 12, NEW, set()).tokens for _ in "ab"]
    assert runs[0] == runs[1]
    with pytest.raises(ValueError, match="recent must be >= 0"):
        tova(recent=-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_example_runs_on_every_architecture(tova, family):
    model = tiny_family(family)
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    res = greedy_generate(model, ids, tova(), 8, 12, set())
    assert len(res.tokens) == 12 and res.kv_bytes < res.fullkv_bytes
