"""GSM-Infinite symbolic problems, generated offline (recipe of Infini-AI-Lab/gsm_infinite
``gsm-infinite/data/symbolic/``).

N variables named V000000..V999999. The first ``op`` form a random tree: the root is assigned a
constant ``randint(0, 10)``, every other node is assigned its parent plus one of "", " + 1",
" - 1". The other N - op variables form a filler tree of the same shape with no constant, so
none of them has a value. The lines are shuffled; the question gives the value of a sampled node
of the real tree and asks for all variables with that value.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from tasks.generators.fit import fit_count

SUFFIXES = ("", " + 1", " - 1")
QUESTION = "Question: which variables are equal to {value}? List all of them."
_LINE = re.compile(r"assign (V\d{6}) = (?:(\d+)|(V\d{6})(?: ([+-]) 1)?)\.")


@dataclass
class SymbolicProblem:
    """One generated problem.

    Attributes
    ----------
    problem : str
        The shuffled assignment lines, one per line.
    question : str
    answer : list[str]
        Names of all variables equal to the asked value (sorted).
    value : int
    op : int
        Variables in the real tree.
    n_vars : int
        All variables.
    """

    problem: str
    question: str
    answer: list[str]
    value: int
    op: int
    n_vars: int


def _tree(names: list[str], rng: random.Random, constant: int | None) -> list[str]:
    lines = []
    if constant is not None:
        lines.append(f"assign {names[0]} = {constant}.")
    for i in range(1, len(names)):
        parent = names[rng.randrange(i)]
        lines.append(f"assign {names[i]} = {parent}{rng.choice(SUFFIXES)}.")
    return lines


def evaluate(problem: str) -> dict[str, int]:
    """Values of all variables that have one, by repeated passes over the lines (brute force).

    Raises
    ------
    ValueError
        If a line is not an assignment.
    """
    rules = []
    for line in problem.splitlines():
        match = _LINE.fullmatch(line.strip())
        if match is None:
            raise ValueError(f"not an assignment: {line!r}")
        rules.append(match.groups())
    values: dict[str, int] = {}
    changed = True
    while changed:
        changed = False
        for target, const, source, sign in rules:
            if target in values:
                continue
            if const is not None:
                values[target] = int(const)
            elif source in values:
                values[target] = values[source] + {None: 0, "+": 1, "-": -1}[sign]
            else:
                continue
            changed = True
    return values


def _make(op: int, n_vars: int, seed: int) -> SymbolicProblem:
    rng = random.Random(seed)
    names = [f"V{i:06d}" for i in rng.sample(range(1_000_000), n_vars)]
    real, filler = names[:op], names[op:]
    lines = _tree(real, rng, rng.randint(0, 10)) + (_tree(filler, rng, None) if filler else [])
    rng.shuffle(lines)
    problem = "\n".join(lines)
    values = evaluate(problem)
    value = values[rng.choice(real)]
    answer = sorted(name for name, v in values.items() if v == value)
    return SymbolicProblem(problem, QUESTION.format(value=value), answer, value, op, n_vars)


def generate(op: int, tokens: int | None, seed: int, count_tokens: Callable[[str, str], int] | None = None,
             n_vars: int | None = None) -> SymbolicProblem:  # fmt: skip
    """A problem with ``op`` real variables, padded with filler variables to about ``tokens`` tokens.

    Parameters
    ----------
    op : int
        Operations (variables of the real tree), >= 1.
    tokens : int | None
        Requested prompt length (tokens, as ``count_tokens(problem, question)`` measures it);
        None: exactly ``n_vars`` variables (default ``op``).
    seed : int
    count_tokens : callable, optional
        Needed with ``tokens``.

    Raises
    ------
    ValueError
        For ``op`` < 1 or a length shorter than the real tree alone.
    """
    if op < 1:
        raise ValueError(f"op must be >= 1, got {op}")
    if tokens is None or count_tokens is None:
        return _make(op, max(op, n_vars or op), seed)

    def length(n: int) -> int:
        p = _make(op, n, seed)
        return count_tokens(p.problem, p.question)

    return _make(op, fit_count(length, tokens, least=op, probe=50, what=f"op={op}"), seed)
