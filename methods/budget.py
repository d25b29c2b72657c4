"""Budget resolution, done once per sample by the framework (DESIGN.md, "Budget")."""

from __future__ import annotations

import math


def validate_budget(budget: float | int | None) -> None:
    """Check a configured budget without a prompt.

    Raises
    ------
    ValueError
        If ``budget`` is not positive, or is a non-integral number above 1.
    """
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget):
        raise ValueError(f"budget must be a number > 0, got {budget!r}")
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    if isinstance(budget, float) and budget > 1 and not budget.is_integer():
        raise ValueError(f"budget {budget} is neither a fraction (<= 1.0) nor a whole slot count")


def resolve_budget(budget: float | int | None, prompt_tokens: int) -> int | None:
    """Slots per (layer, KV head) for one prompt.

    A float in ``(0, 1]`` is a fraction of the prompt's tokens (``budget=1.0`` keeps the whole
    prompt, ``budget=0.05`` keeps 5%); an integer (or a whole float above 1) is an absolute slot
    count. Fractions are floored, with at least one slot, as the ZSMerge code does.

    Parameters
    ----------
    budget : float | int | None
        As configured; None means no compression.
    prompt_tokens : int
        Prompt length in tokens.

    Returns
    -------
    int | None
        The slot budget (tokens), or None.

    Raises
    ------
    ValueError
        As :func:`validate_budget`.
    """
    validate_budget(budget)
    if budget is None:
        return None
    if isinstance(budget, float) and budget <= 1.0:
        return max(1, int(budget * prompt_tokens))
    return int(budget)
