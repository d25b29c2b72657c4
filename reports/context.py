"""What every kind of experiment report reads (:class:`Context`): its own module, so that the report
kinds (``reports.kinds``) and the paired table they show (``reports.experiment_paired``) both import
it and neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from omegaconf import DictConfig

from reports import figures
from reports.paired import RESAMPLES
from reports.runs import budget_axis
from runners.results.store import ResultStore


@dataclass
class Context:
    """What every report kind reads: the job frame, the spec, the jobs, their records (by run id),
    the table's index keys, the store, the figure title, the models of our runs, and the
    ``--baseline`` and ``--resamples`` of the paired differences, and our models standing in for
    the paper's (random weights of its shape)."""

    frame: pd.DataFrame
    spec: DictConfig
    jobs: list
    records: dict[str, dict | None]
    index: list[str]
    store: ResultStore
    title: str
    models: list[str]
    baseline: str | None = None
    n_resamples: int = RESAMPLES
    #: Our models that stand in for a paper's (``reports.cells.stand_in``: random weights of its shape).
    stand_ins: dict = field(default_factory=dict)

    def hue(self, key: str) -> figures.Hue:
        """The hue of ``key`` with the spec's ``legend`` names and title."""
        legend = self.spec.get("legend") or {}
        names = {str(k): str(v) for k, v in (legend.get("names") or {}).items()}
        return figures.Hue(key, names, legend.get("title"))

    def budget_unit(self) -> str | None:
        """What the sweep's budgets count (``prompt``/``context`` fractions or ``slots``)."""
        units = {budget_axis(job.cfg.get("budget"), job.cfg.get("budget_unit")) for job in self.jobs} - {None}
        return next(iter(units)) if len(units) == 1 else None
