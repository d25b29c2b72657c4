"""Per-sample scores of a run's metric from its ``predictions.jsonl`` (docs/results.md), keyed by
sample id, for the paired differences of :mod:`reports.paired`.

A metric a sample's ``metrics`` holds is read as it is (XSum's ``rouge1``). A benchmark average no
sample holds is read through :data:`AVERAGES`: RULER's ``avg`` is the mean over tasks of each task's
mean ``score``, so its samples carry their task as the stratum. A per-task metric (RULER's ``vt``,
LongBench's ``qasper``) is the ``score`` of that task's samples (:data:`GROUPS`). Any other metric
(LongBench's ``cat/*``, GSM-Infinite's ``accuracy/op<k>``) has no per-sample form: reports show no
interval for it and say so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from runners.results.store import ResultStore


@dataclass(frozen=True)
class Average:
    """How a benchmark's average is read per sample: the per-sample ``value`` key, and the key of
    the groups whose means the benchmark averages (None: a plain mean over samples)."""

    value: str
    stratum: str | None


#: Task -> metric -> how a metric no sample holds is read (the tasks' ``score`` methods).
AVERAGES: dict[str, dict[str, Average]] = {
    "ruler": {"avg": Average("score", "task")},
    "longbench": {"avg": Average("score", "subset")},
    "infinitebench": {"avg": Average("score", "task")},
    "gsm_infinite": {"accuracy": Average("score", None)},
}
#: Task -> the per-sample key naming the group a per-group metric (``vt``, ``qasper``) averages.
GROUPS: dict[str, str] = {"ruler": "task", "longbench": "subset", "infinitebench": "task"}


@dataclass
class Scores:
    """Sample id -> score of one setting (seeds averaged per id) and, where the metric averages
    groups, sample id -> group (the bootstrap's strata)."""

    values: dict[str, float] = field(default_factory=dict)
    strata: dict[str, str] | None = None

    def __len__(self) -> int:
        return len(self.values)


def _lines(store: ResultStore, run_id: str) -> list[dict]:
    path = store.run_dir(run_id) / "predictions.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _label(prediction: dict, key: str) -> object:
    """A sample's ``key`` from its ``metrics``, else its ``meta``."""
    return (prediction.get("metrics") or {}).get(key, (prediction.get("meta") or {}).get(key))


def run_scores(store: ResultStore, run_id: str, task: str, metric: str, length: int | None = None) -> Scores:
    """The per-sample scores of ``metric`` in one run (empty where none is stored).

    Parameters
    ----------
    store : ResultStore
        The result store.
    run_id : str
        The run.
    task : str
        The record's task (registry name: ``ruler``, ``xsum``, ...), which says how an average
        is read (:data:`AVERAGES`, :data:`GROUPS`).
    metric : str
        A record metric (``rouge1``, ``avg``, ``vt``).
    length : int | None
        Keep only the samples of this context length (``meta.length``; RULER over several lengths).

    Returns
    -------
    Scores
        Samples without an id are left out (they cannot be paired).
    """
    average = AVERAGES.get(task, {}).get(metric)
    out = Scores(strata={} if average is not None and average.stratum else None)
    for prediction in _lines(store, run_id):
        meta, per = prediction.get("meta") or {}, prediction.get("metrics") or {}
        if prediction.get("id") is None or (length is not None and meta.get("length", length) != length):
            continue
        sid = str(prediction["id"])
        if metric in per:
            value = per[metric]
        elif average is not None:
            value = per.get(average.value)
            if out.strata is not None:
                out.strata[sid] = str(_label(prediction, average.stratum))
        elif task in GROUPS and _label(prediction, GROUPS[task]) == metric:
            value = per.get("score")
        else:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.values[sid] = float(value)
    return out


def pooled(scores: Sequence[Scores]) -> Scores:
    """One setting's scores over its runs (seeds): the mean per sample id, so that no sample counts
    twice; the strata of the first run that has them."""
    sums: dict[str, list[float]] = {}
    for one in scores:
        for sid, value in one.values.items():
            sums.setdefault(sid, []).append(value)
    strata = next((s.strata for s in scores if s.strata), None)
    return Scores({sid: sum(v) / len(v) for sid, v in sums.items()}, strata)


def setting_scores(
    store: ResultStore, run_ids: Iterable[str], task: str, metric: str, length: int | None = None
) -> list[Scores]:
    """:func:`pooled` :func:`run_scores` of each setting, given as its space-separated run ids."""
    return [pooled([run_scores(store, rid, task, metric, length) for rid in ids.split()]) for ids in run_ids]


def stratum(task: str, metric: str) -> str | None:
    """What ``metric`` of ``task`` averages over (``task`` for RULER's ``avg``), None for a plain mean."""
    rule = AVERAGES.get(task, {}).get(metric)
    return rule.stratum if rule is not None else None
