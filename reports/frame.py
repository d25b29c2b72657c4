"""An experiment's sweep joined with the result store: one row per sweep job, its record's numbers.

Reports read only stored records (docs/results.md); the sweep (runners.sweeps) says which records
an experiment should have, so a run that is missing or failed is listed, not silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from omegaconf import OmegaConf

from runners.loggers import flat_summary
from runners.results import ResultStore
from runners.sweeps import Job

GROUP_KEYS = ("method", "task", "model")  # config groups: a row shows the chosen option's name


def key_value(job: Job, record: dict | None, key: str) -> object:
    """The value of report key ``key`` for a job: a config group's chosen option (``method``,
    ``task``, ``model``), or a field of the run's stored config (``budget`` is None where the
    method ignores it), e.g. ``runner.batch`` or ``method.residual_ratio``."""
    if key in GROUP_KEYS:
        chosen = job.choice(key)
        if chosen is not None:
            return chosen
        if key == "model":
            return job.cfg.model.name
        return record.get(key) if record else job.name(key)
    return OmegaConf.select(OmegaConf.create(job.config), key, default=None)


def _number(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else value


def read_records(jobs: Sequence[Job], store: ResultStore) -> dict[str, dict | None]:
    """The stored record of each distinct run of ``jobs`` (None where there is none), read once."""
    return {rid: store.read(rid) for rid in dict.fromkeys(job.run_id for job in jobs)}


def job_frame(jobs: Sequence[Job], records: dict[str, dict | None], keys: Sequence[str]) -> pd.DataFrame:
    """One row per job: ``run_id``, ``status`` (``ok``/``error``/``oom``, or ``missing`` when the
    store has no record), ``error``, ``overrides``, the report ``keys`` and the record's flat
    metrics and efficiency figures (:func:`runners.loggers.flat_summary`). ``records`` as
    :func:`read_records`."""
    rows = []
    for job in jobs:
        record = records[job.run_id]
        row: dict = {
            "run_id": job.run_id,
            "status": record["status"] if record else "missing",
            "error": record.get("error") if record else None,
            "overrides": " ".join(job.overrides),
            "n_samples": record.get("samples_done", record.get("n_samples")) if record else None,
        }
        if record and record["status"] == "ok":
            summary = flat_summary(record)
            row.update({k: _number(v) for k, v in summary.items() if k not in row and k not in keys})
        row.update({k: key_value(job, record, k) for k in keys})
        rows.append(row)
    return pd.DataFrame(rows)


def cell_means(frame: pd.DataFrame, keys: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean of each value over the distinct finished runs sharing ``keys`` (a run reached by
    several sweep points, e.g. FullKV at every budget, counts once)."""
    done = frame[frame["status"] == "ok"].drop_duplicates("run_id")
    present = [v for v in values if v in done.columns]
    if done.empty or not present:
        return pd.DataFrame(columns=[*keys, *present])
    labelled = done.assign(**{k: done[k].map(label) for k in keys})
    return labelled.groupby(list(keys), sort=False, dropna=False)[present].mean().reset_index()


def label(value: object) -> str:
    """Text of a key value in a table: ``none`` for None, ``0.2`` for floats, names as they are."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def not_done(frame: pd.DataFrame) -> pd.DataFrame:
    """The jobs without a finished record: status, error and overrides (distinct runs)."""
    rows = frame[frame["status"] != "ok"].drop_duplicates("run_id")
    return rows[["status", "overrides", "error", "run_id"]].reset_index(drop=True)
