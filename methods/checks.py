"""Hyperparameter checks shared by the methods' ``__post_init__``."""

from __future__ import annotations

import dataclasses

from tasks.options import CLAMP, RANGE, option

__all__ = ["CLAMP", "RANGE", "check_bounds", "check_range", "option"]


def check_range(method: object, *fields: str, low: float = 0.0, high: float = 1.0) -> None:
    """Check that each named field of ``method`` lies in ``[low, high]`` (a fraction by default).

    Raises
    ------
    ValueError
        ``<field> must be in [<low>, <high>], got <value>`` for the first field outside (or NaN, or not a
        number).
    """
    for name in fields:
        value = getattr(method, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value}")


def check_bounds(method: object) -> None:
    """Check each field of the dataclass ``method`` against the numeric bounds its :func:`option`
    declares (a bound that names a model fact, such as ``"max_context"``, is left to the run's schema,
    which knows the model). For a method built in Python; a run refuses the same values before loading.

    Raises
    ------
    ValueError
        ``<field> must be >= <low>, got <value>`` (``<= <high>``, or ``in [<low>, <high>]`` when both
        bounds are numbers) for the first field outside its bounds.
    """
    for f in dataclasses.fields(method):  # type: ignore[arg-type]
        low, high = f.metadata.get(RANGE, (None, None))
        low = low if isinstance(low, int | float) else None
        high = high if isinstance(high, int | float) else None
        value = getattr(method, f.name)
        if (low is None and high is None) or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if (low is not None and not value >= low) or (high is not None and not value <= high):
            wanted = (
                f"in [{low:g}, {high:g}]"
                if low is not None and high is not None
                else f">= {low:g}"
                if low is not None
                else f"<= {high:g}"
            )
            raise ValueError(f"{f.name} must be {wanted}, got {value}")
