"""Budget resolution, done once per sample by the framework (docs/design.md, "Budget")."""

from __future__ import annotations

import math

from methods.seam.plan import Slots

BUDGET_UNITS = ("prompt", "context")


def validate_budget(budget: float | int | None, unit: str = "prompt") -> None:
    """Check a configured budget and its unit without a prompt.

    A float in ``(0, 1]`` is a fraction and an integer an absolute slot count, so ``budget=1``
    (one slot) and ``budget=1.0`` (the whole prompt) differ by a dot: the integer 1 is refused.

    Raises
    ------
    ValueError
        If ``budget`` is not positive, is the integer 1 (the message names both spellings), is a
        non-integral number above 1, or the unit is unknown.
    """
    if unit not in BUDGET_UNITS:
        raise ValueError(f"budget_unit must be one of {BUDGET_UNITS}, got {unit!r}")
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget):
        raise ValueError(f"budget must be a number > 0, got {budget!r}")
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    if budget == 1 and isinstance(budget, int):
        raise ValueError(
            "budget=1 is ambiguous: write budget=1.0 for the whole prompt (a fraction), "
            "or an integer >= 2 for an absolute slot count"
        )
    if isinstance(budget, float) and budget > 1 and not budget.is_integer():
        raise ValueError(f"budget {budget} is neither a fraction (<= 1.0) nor a whole slot count")


def resolve_budget(
    budget: float | int | None, prompt_tokens: int, context_tokens: int | None = None, unit: str = "prompt"
) -> int | None:
    """Slots per (layer, KV head) for one prompt.

    A float in ``(0, 1]`` is a fraction of the prompt's tokens (``unit="prompt"``: ``budget=1.0``
    keeps the whole prompt, ``0.05`` keeps 5%) or of the model's context window
    (``unit="context"``: ``max_position_embeddings``, the convention of the LESS and ZSMerge XSum
    experiments, docs/methods.md, "Conventions"); an integer (or a whole float above 1) is an absolute slot
    count in either unit. Fractions are floored, with at least one slot, as the ZSMerge code does.

    Parameters
    ----------
    budget : float | int | None
        As configured; None means no compression.
    prompt_tokens : int
        Prompt length in tokens.
    context_tokens : int | None
        The model's context window in tokens (needed for ``unit="context"``).
    unit : str
        ``"prompt"`` or ``"context"``.

    Returns
    -------
    int | None
        The slot budget (tokens), or None; from a share of the prompt a
        :class:`~methods.seam.plan.Slots` that keeps the share.

    Raises
    ------
    ValueError
        As :func:`validate_budget`, for an unknown unit, or a context unit without a context size.
    """
    validate_budget(budget, unit)
    if budget is None:
        return None
    if isinstance(budget, float) and budget <= 1.0:
        if unit == "context" and not context_tokens:
            raise ValueError("budget_unit=context needs the model's context size")
        slots = max(1, int(budget * (prompt_tokens if unit == "prompt" else context_tokens)))
        return Slots(slots, budget) if unit == "prompt" else slots
    return int(budget)
