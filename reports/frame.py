"""An experiment's sweep joined with the result store: one row per sweep job, its record's numbers.

Reports read only stored records (docs/results.md); the sweep (runners.results.sweep_jobs) says which records
an experiment should have, so a run that is missing or failed is listed, not silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from reports.presets import budget_ignored
from runners.results.store import (
    RENAMED_OPTIONS,
    ResultStore,
    flat_summary,
    run_config,
    run_identity,
    setting_id,
)
from runners.results.sweep_jobs import Job, composed_jobs

GROUP_KEYS = ("method", "task", "model")  # config groups: a row shows the chosen option's name


def key_value(job: Job, record: dict | None, key: str) -> object:
    """The value of report key ``key`` for a job: the model's name (as the run recorded it, so a
    GGUF run through ``model=gguf`` or its converted folder shows under one name), a config
    group's chosen option (``method``, ``task``), or a field of the run's stored config
    (``budget`` is None where the method ignores it), e.g. ``runner.batch_size`` or
    ``method.residual_ratio``."""
    if key == "model":  # the run's model name (one model, one name: not the loader chosen)
        stored = ((record or {}).get("config") or {}).get("model") or {}
        return stored.get("name") or job.cfg.model.name or job.choice(key)
    if key in GROUP_KEYS:
        chosen = job.choice(key)
        if chosen is not None:
            return chosen
        return record.get(key) if record else job.name(key)
    return OmegaConf.select(OmegaConf.create(job.config), key, default=None)


def _number(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else value


def read_records(jobs: Sequence[Job], store: ResultStore) -> dict[str, dict | None]:
    """The stored record of each distinct run of ``jobs`` (None where there is none), read once."""
    return {rid: store.read(rid) for rid in dict.fromkeys(job.run_id for job in jobs)}


def report_jobs(
    experiment: str, scale: str, overrides: Sequence[str], store: ResultStore
) -> tuple[DictConfig, list[Job], dict[str, dict | None]]:
    """The sweep's jobs matched with the store, without building the methods (no torch).

    A job's record is found by its setting id (``setting_id``: the config alone; a run's id adds
    the hash of the model and data it read), the newest finished run of that setting
    (``ResultStore.find``; the report names the setting's runs on other inputs). Its setting
    depends on whether its method uses the budget (FullKV does not: its record has budget null);
    both candidates are looked up and the one with a record is the job's (a job with neither is
    missing under the setting id :func:`reports.presets.budget_ignored` names). Returns the
    experiment's base config, the jobs (``run_id`` the record's, ``names`` from their records)
    and the records by run id."""
    base, composed = composed_jobs(experiment, scale, overrides)
    jobs, records, found = [], {}, {}
    for job_overrides, cfg in composed:
        configs = [run_config(cfg, True), run_config(cfg, False)]
        sids = [setting_id(config) for config in configs]
        for sid in sids:
            if sid not in found:
                found[sid] = store.find(sid)
        guess = 1 if budget_ignored(configs[0].get("method") or {}) else 0
        pick = next((i for i, sid in enumerate(sids) if found[sid] is not None), guess)
        record = found[sids[pick]]
        rid = record["run_id"] if record else sids[pick]
        records[rid] = record
        names = {"method": (record or {}).get("method"), "task": (record or {}).get("task")}
        jobs.append(Job(job_overrides, cfg, configs[pick], rid, names))
    return base, jobs, records


def _flat(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


#: Keys that must agree for a stored run to count as "the same run with other overrides".
SAME_SETTING = ("model.name", "method._target_", "task._target_", "runner.name")


def near_misses(jobs: Sequence[Job], records: dict[str, dict | None], store: ResultStore) -> dict[str, int]:
    """Stored finished runs that differ from a missing job only by a few overrides: override text
    (``task.limit=20``, the stored run's values) -> how many missing jobs it would fill."""
    missing = [job for job in jobs if records.get(job.run_id) is None]
    if not missing:
        return {}
    stored = [_flat(run_identity(r["config"])) for r in store.records() if r.get("status") == "ok"]
    counts: dict[str, int] = {}
    for job in missing:
        want = _flat(run_identity(job.config))
        for have in stored:
            if any(want.get(k) != have.get(k) for k in SAME_SETTING):
                continue
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            if have.get("budget") is None:  # a method that ignores the budget (FullKV) stores none
                diff = [k for k in diff if k != "budget"]
            if any(k == "budget" or k.startswith("method.") for k in diff):
                continue  # another budget or other hyperparameters: another setting, not other overrides
            if diff and len(diff) <= 3:  # identity keys hashed under an old name shown under the new one
                text = " ".join(f"{RENAMED_OPTIONS.get(k, k)}={_override(have.get(k))}" for k in diff)
                counts[text] = counts.get(text, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _override(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def job_frame(jobs: Sequence[Job], records: dict[str, dict | None], keys: Sequence[str]) -> pd.DataFrame:
    """One row per job: ``run_id``, ``status`` (``ok``/``error``/``oom``, or ``missing`` when the
    store has no record), ``error``, ``overrides``, the report ``keys`` and the record's flat
    metrics and efficiency figures (:func:`runners.results.store.flat_summary`). ``records`` as
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
