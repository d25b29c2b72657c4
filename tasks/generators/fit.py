"""Choosing how many filler units make a generated prompt a requested number of tokens long, and the
bisection that finds the largest count (or batch, or length) that fits."""

from __future__ import annotations

from collections.abc import Callable


def fit_count(length: Callable[[int], int], tokens: int, least: int, probe: int, what: str) -> int:
    """A unit count ``n >= least`` whose prompt is ``tokens`` long within 0.5%, or the closest of a
    few Newton steps on the (almost linear) length.

    Parameters
    ----------
    length : callable
        ``length(n)`` -> prompt tokens with ``n`` units (filler lines, JSON pairs, variables).
    tokens : int
        Requested prompt length (tokens).
    least : int
        Smallest allowed count.
    probe : int
        Extra units of the first slope estimate, ``(length(least + probe) - length(least)) / probe``.
    what : str
        Name used in the error message.

    Raises
    ------
    ValueError
        If even ``least`` units are longer than ``tokens``.
    """
    base = length(least)
    if tokens < base:
        raise ValueError(f"{what} needs at least {base} tokens, {tokens} requested")
    slope = max(1.0, (length(least + probe) - base) / probe)
    n = least + round((tokens - base) / slope)
    for _ in range(4):
        got = length(n)
        if abs(got - tokens) <= 0.005 * tokens:
            break
        n = max(least, n + round((tokens - got) / slope))
    return n


def bisect_fitting(fits: Callable[[int], bool], good: int, bad: int) -> int:
    """The largest ``n`` in ``[good, bad)`` with ``fits(n)``, given that ``good`` fits and ``bad`` does not
    (``fits`` monotone: true then false), by bisection: the midpoints ``(good + bad) // 2`` in turn."""
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
