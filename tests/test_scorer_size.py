"""A scorer is small: the score-then-evict methods written as one score (kvpress's presses are the
model) stay at or under 40 code lines (lines that are not blank, comments or docstrings)."""

from __future__ import annotations

import ast
import io
import tokenize

import pytest

from tests.conftest import REPO

#: The bar for a scorer, in code lines.
BAR = 40
#: The scorers held to it.
SCORERS = ("snapkv", "tova", "knorm", "keydiff", "observed_attention", "random", "cur")
SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """The lines of ``source`` that hold code: not blank, a comment or part of a docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    lines = {n for t in tokens if t.type not in SKIPPED for n in range(t.start[0], t.end[0] + 1)}
    return len(lines - docstrings)


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    source = '"""Module."""\n\n# a comment\ndef f(x):\n    """Doc\n    string."""\n'
    source += "    return (x +\n            1)  # why\n"
    assert code_lines(source) == 3


@pytest.mark.parametrize("name", SCORERS)
def test_a_scorer_is_at_most_40_code_lines(name):
    assert code_lines((REPO / "methods" / f"{name}.py").read_text(encoding="utf-8")) <= BAR
