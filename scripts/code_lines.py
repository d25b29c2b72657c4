"""Code lines of Python files: lines that are not blank, not a comment alone and not part of a
docstring (the string statement that opens a module, class or function). Usage:
``python scripts/code_lines.py methods/seam`` (a folder: every ``*.py`` under it)."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path


def code_lines(source: str) -> int:
    """Lines of ``source`` holding code (module docstring)."""
    skip: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                skip.update(range(body[0].lineno, body[0].end_lineno + 1))
    layout = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in layout:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - skip)


def main(paths: list[str]) -> None:
    total = 0
    for path in paths:
        files = sorted(Path(path).rglob("*.py")) if Path(path).is_dir() else [Path(path)]
        for file in files:
            n = code_lines(file.read_text())
            total += n
            print(f"{n:5d} {file}")
    print(f"{total:5d} total")


if __name__ == "__main__":
    main(sys.argv[1:])
