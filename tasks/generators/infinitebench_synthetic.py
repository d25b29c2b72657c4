"""InfiniteBench's synthetic retrieval tasks, generated offline at a requested length and depth.

Recipe of OpenBMB/InfiniteBench ``data/construct_synthetic_dataset.py``: the filler line repeated
N times with one needle inserted after j = round(depth x N) lines (passkey: 5 random digits;
number_string: 10 random digits), or a JSON object of N uuid -> uuid pairs whose queried key sits
at index round(depth x (N - 1)) (kv_retrieval). N is chosen so the rendered prompt has the
requested number of tokens.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tasks.generators.fit import fit_count

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
NEEDLES = {
    "passkey": ("The pass key is {key}. Remember it. {key} is the pass key.\n", "What is the pass key?", 5),
    "number_string": (
        "The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n",
        "What is the sequence of digits?",
        10,
    ),
}
KV_QUESTION = '\nKey: "{key}"\nThe value associated with the specified key is: '
SYNTHETIC_TASKS = ("passkey", "number_string", "kv_retrieval")


@dataclass
class SyntheticRow:
    """One generated row in the hub schema (``context``, ``input``, ``answer``) plus its geometry.

    Attributes
    ----------
    needle_index : int
        Filler lines before the needle (kv_retrieval: index of the queried pair).
    units : int
        Filler lines (kv_retrieval: pairs) in the context.
    """

    id: str
    context: str
    input: str
    answer: list[str]
    needle: str
    needle_index: int
    units: int


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _build(task: str, units: int, depth: float, rng_seed: int) -> SyntheticRow:
    rng = random.Random(rng_seed)
    if task == "kv_retrieval":
        pairs = [(_uuid(rng), _uuid(rng)) for _ in range(units)]
        index = round(depth * (units - 1))
        key, value = pairs[index]
        context = "JSON data:\n" + json.dumps(dict(pairs))
        return SyntheticRow("", context, KV_QUESTION.format(key=key), [value], key, index, units)
    template, question, digits = NEEDLES[task]
    if task == "passkey":
        key = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    else:
        key = "".join(rng.choice("0123456789") for _ in range(digits))
    index = round(depth * units)
    needle = template.format(key=key)
    context = FILLER * index + needle + FILLER * (units - index)
    return SyntheticRow("", context, question, [key], needle, index, units)


def generate(
    task: str,
    tokens: int,
    depth: float,
    seed: int,
    count_tokens: Callable[[str, str], int],
) -> SyntheticRow:
    """One row whose rendered prompt has about ``tokens`` tokens.

    Parameters
    ----------
    task : str
        ``passkey``, ``number_string`` or ``kv_retrieval``.
    tokens : int
        Requested prompt length (tokens, as ``count_tokens`` measures it).
    depth : float
        Needle position in [0, 1] (0: start of the context, 1: its end).
    seed : int
        Seeds the key, the value and the uuids.
    count_tokens : callable
        ``count_tokens(context, input)`` -> prompt tokens under the task's prompt protocol.

    Returns
    -------
    SyntheticRow

    Raises
    ------
    ValueError
        For an unknown task, a depth outside [0, 1], or a length too short for one unit.
    """
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"no offline generator for InfiniteBench task {task!r} (have {SYNTHETIC_TASKS})")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"needle depth must be in [0, 1], got {depth}")

    def length(units: int) -> int:
        row = _build(task, units, depth, seed)
        return count_tokens(row.context, row.input)

    units = fit_count(length, tokens, least=1, probe=40, what=task)
    row = _build(task, units, depth, seed)
    row.id = f"{task}-len{tokens}-depth{depth:g}-seed{seed}"
    return row
