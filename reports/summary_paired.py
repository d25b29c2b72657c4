"""The paired differences of ``python -m reports summary``: per budget, each compressed setting of
every (model, task) against FullKV and against ``--baseline`` at the same budget and protocol, in
the task's primary metric (:mod:`reports.versus`; RULER's, LongBench's and InfiniteBench's average
resampled within their tasks or subsets, :mod:`reports.persample`)."""

from __future__ import annotations

import pandas as pd

from reports.paired import RESAMPLES
from reports.persample import setting_scores, stratum
from reports.versus import Compared, differences
from runners.results.store import ResultStore


def compared(
    store: ResultStore, runs: pd.DataFrame, baseline: str | None = None, n_resamples: int = RESAMPLES
) -> Compared:
    """:func:`reports.versus.differences` of :func:`reports.summary.scored_runs`' rows (their
    ``method`` is the display label, ``registry`` the method), compared within (model, task) at
    the same budget, unit and protocol.

    Raises
    ------
    KVBenchError
        When ``baseline`` has no run on the compared samples, or is ambiguous.
    """
    scores = [setting_scores(store, [r.run_ids], r.task, r.metric)[0] for r in runs.itertuples()]
    strata = {s for r in runs.itertuples() if (s := stratum(r.task, r.metric))}
    by = " or ".join(sorted(strata)) + " where the metric averages them" if strata else None
    settings = runs.rename(columns={"method": "label", "registry": "method"})
    level = ["budget", "budget_unit", "protocol"]
    return differences(settings, scores, ["model", "task"], level, baseline, n_resamples, by)


def tables(result: Compared) -> dict[str, pd.DataFrame]:
    """Per budget, one row per compressed setting: task (model, metric), method, n and the
    difference columns (:meth:`reports.versus.Compared.table`)."""
    frame = result.frame.assign(where=result.frame["task"] + " (" + result.frame["model"] + ", ")
    frame = frame.assign(where=frame["where"] + frame["metric"] + ")").sort_values(["task", "model", "label"])
    keys = {"where": "task", "label": "method"}
    return {budget: result.table(keys, part) for budget, part in frame.groupby("budget", sort=False)}
