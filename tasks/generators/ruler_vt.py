"""RULER's variable tracking (NVIDIA/RULER ``scripts/data/synthetic/variable_tracking.py``).

One chain of ``hops + 1`` assignments ``VAR X0 = 12345``, ``VAR X1 = VAR X0 ``, ... is scattered
over noise lines; the answer is every variable of the chain. RULER puts one solved example in
front (3-letter variables, about 500 tokens, its template collapsed to single spaces without the
word before the answer prefix) and 5-letter variables in the sample itself.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

from tasks.generators.ruler_text import NOISE, TEMPLATES, RulerRow, largest_fitting

#: RULER sizes the few-shot example to 500 tokens with 30 tokens to generate.
EXAMPLE_TOKENS, EXAMPLE_ANSWER_TOKENS = 500, 30


def _chain(rng: random.Random, hops: int, letters: int) -> tuple[list[str], list[str]]:
    """Distinct variable names and their assignments (the first one a 5-digit value)."""
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    chain = [f"VAR {names[0]} = {rng.randint(10000, 99999)}"]
    chain += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
    return names, chain


def _haystack(rng: random.Random, units: int, chain: list[str]) -> tuple[str, list[int]]:
    """Noise lines with the chain inserted at sorted random positions (and their line numbers)."""
    lines = [NOISE + "\n"] * units
    positions = sorted(rng.sample(range(units), len(chain)))
    for j, (position, assignment) in enumerate(zip(positions, chain, strict=True)):
        lines.insert(position + j, assignment)
    return " ".join(lines).replace(". \n", ".\n"), [p + j for j, p in enumerate(positions)]


def build(units: int, seed: str, hops: int, example: str) -> RulerRow:
    """A vt row with ``units`` noise lines after the solved ``example`` (see :func:`example`).

    Returns
    -------
    RulerRow
        ``answers``: the chain's variables; ``meta``: ``chain`` (the assignments), ``lines``
        (their indices among the haystack's items: noise lines and assignments), ``units``.

    Raises
    ------
    ValueError
        If ``units`` is smaller than the chain.
    """
    if units < hops + 1:
        raise ValueError(f"vt needs at least {hops + 1} noise lines")
    rng = random.Random(seed)
    names, chain = _chain(rng, hops, letters=5)
    haystack, lines = _haystack(rng, units, chain)
    head, tail, prefix = TEMPLATES["vt"]
    value = chain[0].split("=")[-1].strip()
    context = " " + example + "\n\n" + head + haystack
    meta = {"chain": chain, "lines": lines, "units": units}
    prefix = prefix.format(query=value, num_v=hops + 1)
    return RulerRow(context, tail.format(query=value), prefix, names, meta)


def example(seed: str, hops: int, count_tokens: Callable[[str], int]) -> str:
    """RULER's solved example: its input, a space, its answer, a blank line.

    ``count_tokens(text)`` counts raw tokens; the example holds as many noise lines as keep
    ``tokens(input + " " + answer) + 30 <= 500``.
    """
    head, tail, prefix = TEMPLATES["vt"]
    template = " ".join((head + "{context}" + tail).split()[:-1]) + prefix

    def render(units: int) -> tuple[str, list[str]]:
        rng = random.Random(seed)
        names, chain = _chain(rng, hops, letters=3)
        haystack, _ = _haystack(rng, units, chain)
        value = chain[0].split("=")[-1].strip()
        return template.format(context=haystack, query=value, num_v=hops + 1), names

    def fits(units: int) -> bool:
        text, names = render(units)
        return count_tokens(text + " " + " ".join(names)) + EXAMPLE_ANSWER_TOKENS <= EXAMPLE_TOKENS

    text, names = render(largest_fitting(fits, hops + 1, EXAMPLE_TOKENS))
    return text + " " + " ".join(names) + "\n\n"
