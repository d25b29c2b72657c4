"""GSM-Infinite answer extraction and scoring, as ZSMerge's ``exam/gsminfinite/score_real.py`` and
``score_symb.py`` do it (docs/methods.md, "GSM-Infinite")."""

from __future__ import annotations

import re

_MODEL_ANSWER_PATTERNS = (
    r"answer is[:\s]*(-?\d+)",
    r"answer:\s*(-?\d+)",
    r"solution:\s*(-?\d+)",
    r"is\s+(-?\d+)\.",
    r"oxed\{(-?\d+)\}",
    r"final answer is\s*(-?\d+)",
    r"result is\s*(-?\d+)",
)


def reference_answer(solution: str) -> int | None:
    """The integer after "Answer:" in a realistic-subset solution (None if absent)."""
    match = re.search(r"Answer:\s*(-?\d+)", solution, re.IGNORECASE)
    return int(match.group(1)) if match else None


def model_answer(reply: str) -> int | None:
    """The reply's answer: the first pattern that matches in order (lower-cased text, backspace
    pairs removed), else the last integer of the reply, else None."""
    text = re.sub(r".\x08", "", reply.lower())
    for pattern in _MODEL_ANSWER_PATTERNS:
        if match := re.search(pattern, text):
            return int(match.group(1))
    if match := re.search(r"(-?\d+)(?!.*\d)", text):
        return int(match.group(1))
    return None


def realistic_correct(reply: str, solution: str) -> float:
    """1.0 if the extracted reply answer equals the solution's answer, else 0.0."""
    want = reference_answer(solution)
    return float(want is not None and model_answer(reply) == want)


def symbolic_recall(reply: str, answer_names: list[str]) -> float:
    """Recall of the ground-truth variable names found as whole words in the reply.

    With an empty truth set ("None" removed), 1.0 iff the reply names no variable ``V<digits>``.
    """
    truth = [name for name in answer_names if name != "None"]
    if not truth:
        return float(re.search(r"\bV\d+\b", reply) is None)
    found = sum(re.search(rf"\b{re.escape(name)}\b", reply) is not None for name in truth)
    return found / len(truth)
