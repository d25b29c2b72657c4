"""Hyperparameter checks shared by the methods' ``__post_init__``."""

from __future__ import annotations

from tasks.options import CLAMP, RANGE, option

__all__ = ["CLAMP", "RANGE", "check_range", "option"]


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
