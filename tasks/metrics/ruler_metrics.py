"""RULER's scorers (NVIDIA/RULER ``scripts/eval/synthetic/constants.py`` and ``evaluate.py``).

A prediction is post-processed (control characters to newlines, stripped) and the references are
looked for in it as case-insensitive substrings. Per sample, in [0, 1]; RULER averages x 100.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: control characters become newlines, then strip."""
    return _CONTROL.sub("\n", prediction).strip()


def string_match_all(prediction: str, references: list[str]) -> float:
    """The fraction of the references found in the prediction (niah, vt, cwe, fwe)."""
    pred = postprocess(prediction).lower()
    return sum(r.lower() in pred for r in references) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """1 if any reference is found in the prediction, else 0 (qa)."""
    pred = postprocess(prediction).lower()
    return float(any(r.lower() in pred for r in references))
