"""Paired differences between two settings scored on the same samples: the difference of their means
and its 95% bootstrap interval over sample ids (``scipy.stats.bootstrap``), and the leaderboard's
ranks with ties.

A difference is paired: both settings' scores of a sample id enter a resample together, so what the
samples share (an easy sample is easy for every method) cancels. Over a benchmark whose score is the
average of per-task means (RULER's ``avg``), the resampling is stratified: sample ids are resampled
within each task and the task means averaged as the benchmark averages them (Efron & Tibshirani,
*An Introduction to the Bootstrap*, 1993, sec. 3.7 and ch. 13 for the percentile interval).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap

from reports.runs import MIN_N

CONFIDENCE = 0.95
#: The seed of every resampling: a report is the same each time it is written.
SEED = 0
#: Bootstrap resamples unless ``--resamples`` says otherwise.
RESAMPLES = 10_000


@dataclass(frozen=True)
class Difference:
    """A paired difference ``mean(setting) - mean(other)`` (in the metric's units) over ``n`` shared
    sample ids, with its 95% interval (NaN bounds below :data:`~reports.runs.MIN_N` samples)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def has_interval(self) -> bool:
        """Whether the interval was computed (n >= :data:`~reports.runs.MIN_N`)."""
        return not math.isnan(self.low)

    def includes_zero(self) -> bool:
        """Whether the interval holds 0 (the two settings cannot be told apart).

        Raises
        ------
        ValueError
            Without an interval (n < :data:`~reports.runs.MIN_N`).
        """
        if not self.has_interval:
            raise ValueError(f"no interval below {MIN_N} samples (n = {self.n})")
        return self.low <= 0.0 <= self.high

    def text(self) -> str:
        """``-12.31 [-18.46, -6.15]``; the difference alone without an interval."""
        head = f"{self.mean:+.2f}"
        return f"{head} [{self.low:.2f}, {self.high:.2f}]" if self.has_interval else head


def _mean_gap(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return a.mean(axis=axis) - b.mean(axis=axis)


def paired_difference(
    scores: Mapping[str, float],
    other: Mapping[str, float],
    strata: Mapping[str, str] | None = None,
    n_resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Difference:
    """The paired difference of two settings' mean scores and its 95% percentile-bootstrap interval.

    Parameters
    ----------
    scores, other : Mapping[str, float]
        Sample id -> score of each setting; only the ids both scored are compared, in the order of
        ``scores`` (the order of the run's ``predictions.jsonl``).
    strata : Mapping[str, str] | None
        Sample id -> stratum (RULER task). With two or more strata the statistic is the mean over
        strata of the per-stratum mean difference, and ids are resampled within their stratum (a
        stratum of one sample is held fixed: every resample draws it). None: one stratum, the
        plain mean.
    n_resamples : int
        Bootstrap resamples.
    seed : int
        Seed of ``numpy.random.default_rng`` (the same report every time).

    Returns
    -------
    Difference
        ``n`` shared ids; NaN bounds below :data:`~reports.runs.MIN_N` of them.

    Notes
    -----
    Unstratified, this is ``scipy.stats.bootstrap((a, b), mean(a) - mean(b), paired=True)``.
    Stratified, scipy resamples each stratum's per-sample differences independently
    (``paired=False`` across strata): resampling a difference ``a_i - b_i`` resamples the pair.
    """
    ids = [i for i in scores if i in other]  # the order the scores were recorded in
    a = np.array([scores[i] for i in ids], dtype=float)
    b = np.array([other[i] for i in ids], dtype=float)
    labels = [str((strata or {}).get(i, "")) for i in ids]
    groups = {s: [k for k, label in enumerate(labels) if label == s] for s in dict.fromkeys(labels)}
    if not ids:
        return Difference(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    if len(groups) < 2:
        mean = float(a.mean() - b.mean())
        if len(ids) < MIN_N:
            return Difference(mean, math.nan, math.nan, len(ids))
        data: tuple = (a, b)
        res = bootstrap(
            data, _mean_gap, paired=True, n_resamples=n_resamples, confidence_level=CONFIDENCE,
            method="percentile", rng=rng,
        )  # fmt: skip
    else:
        gaps = [a[k] - b[k] for k in groups.values()]
        mean = float(np.mean([g.mean() for g in gaps]))
        if len(ids) < MIN_N:
            return Difference(mean, math.nan, math.nan, len(ids))
        resampled = [g for g in gaps if g.size > 1]
        fixed = [float(g[0]) for g in gaps if g.size == 1]
        if not resampled:  # every stratum holds one sample: nothing varies
            return Difference(mean, mean, mean, len(ids))

        def stratified(*parts: np.ndarray, axis: int = -1) -> np.ndarray:
            means = [p.mean(axis=axis) for p in parts]
            return (np.sum(means, axis=0) + sum(fixed)) / len(gaps)

        res = bootstrap(
            tuple(resampled), stratified, paired=False, n_resamples=n_resamples,
            confidence_level=CONFIDENCE, method="percentile", rng=rng,
        )  # fmt: skip
    return Difference(mean, float(res.confidence_interval.low), float(res.confidence_interval.high), len(ids))


def tied_ranks(means: Sequence[float], versus: Callable[[int, int], Difference]) -> list[int | None]:
    """Ranks with ties by the best: the best mean is rank 1 and so is every setting whose paired
    interval against it (``versus(i, best)``) includes 0; the rule repeats among the rest, ranks
    counted as in competition ranking (1, 1, 3). Equal means keep their input order.

    Returns
    -------
    list[int | None]
        The rank of each setting; all None where an interval is missing (n < :data:`MIN_N`).
    """
    left = sorted(range(len(means)), key=lambda i: -means[i])
    ranks: list[int | None] = [None] * len(means)
    while left:
        best, rank = left[0], len(means) - len(left) + 1
        gaps = {i: versus(i, best) for i in left[1:]}
        if any(not g.has_interval for g in gaps.values()):
            return [None] * len(means)
        tied = {best} | {i for i, g in gaps.items() if g.includes_zero()}
        for i in tied:
            ranks[i] = rank
        left = [i for i in left if i not in tied]
    return ranks


def method_text(n: Sequence[int], n_resamples: int, stratified: str | None = None) -> str:
    """The interval method for a caption: ``95% paired bootstrap over sample ids, stratified by
    task, 10,000 resamples, seed 0; n = 130 samples`` (``n = 12-30`` when the compared sets
    differ), and that below :data:`MIN_N` no interval is drawn."""
    low, high = (min(n), max(n)) if n else (0, 0)
    count = f"{low}" if low == high else f"{low}-{high}"
    by = f", stratified by {stratified}" if stratified else ""
    text = (
        f"{CONFIDENCE:.0%} paired bootstrap over sample ids{by}, {n_resamples:,} resamples, seed {SEED} "
        f"(scipy.stats.bootstrap, percentile); n = {count} samples"
    )
    return text + (f"; no interval below n = {MIN_N}" if low < MIN_N else "")
