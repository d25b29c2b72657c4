"""The line a ``--multirun`` sweep ends with: ``sweep <dir>: N ok / M failed / K skipped``.

Counted from files, not from the launching process, so it holds for jobs run in other processes
(submitit): every job of the sweep leaves its composed config in ``<sweep dir>/<job>/.hydra/config.yaml``,
which gives its setting id (``runners.results.store.setting_id``); the result store says how the runs of
that setting ended.

- ok / failed: the job's record was written by this sweep (its ``sweep.dir``) with status ``ok`` /
  anything else (``error``, ``oom``, ``interrupted``); a job with no record at all (killed) is failed;
- skipped: the job's run had finished before (an ``ok`` record from another sweep or a single run),
  so the job reused it (``rerun=false``).

A job whose saved config names none of its runs (a ``runner=quality_grid`` job, whose runs are its
settings'; a ``model=hf`` job, whose model fields are filled when it runs) is counted by the records
this sweep wrote for its job number: ok when every one is ``ok``. A grid job that wrote none (every
setting had finished before) is skipped: it lists its runs in ``<job dir>/runs.json`` (:func:`note_job_runs`).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runners.results.store import ResultStore


def job_setting_id(job_config: Path) -> str:
    """Setting id of the job whose composed config Hydra saved at ``job_config``: the first part of
    the id its run is stored under (``runners.output.record.run_config``; a method config that does not
    build counts as compressing, as ``runners.output.record.record_failure`` stores it).

    Raises
    ------
    OSError, omegaconf.errors.OmegaConfBaseException
        If the file cannot be read or its interpolations resolved.
    """
    from hydra.utils import instantiate

    from runners.output.record import run_config
    from runners.results.store import setting_id

    cfg = OmegaConf.load(job_config)
    try:
        budget_applies = instantiate(cfg.method).traits.budget_applies
    except Exception:  # the job failed on its method config; its record says so
        budget_applies = True
    return setting_id(run_config(cfg, budget_applies))


#: The file in a Hydra job's output directory that lists the runs of a job whose config names none.
JOB_RUNS = "runs.json"


def note_job_runs(run_ids: list[str]) -> None:
    """Write ``run_ids`` to :data:`JOB_RUNS` in the Hydra job's output directory (nothing outside a
    Hydra job): the summary then knows a grid job's runs when the job wrote no record."""
    out = OmegaConf.select(HydraConfig.get(), "runtime.output_dir") if HydraConfig.initialized() else None
    if out and Path(out).is_dir():  # a config composed outside a Hydra job has none
        (Path(out) / JOB_RUNS).write_text(json.dumps(sorted(run_ids)) + "\n")


def _listed_runs(job_dir: Path) -> list[str]:
    """The run ids a job listed (:func:`note_job_runs`), [] if it listed none."""
    try:
        return list(json.loads((job_dir / JOB_RUNS).read_text()))
    except (OSError, ValueError, TypeError):
        return []


def _same_dir(a: str | Path, b: str | Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def sweep_counts(sweep_dir: str | Path, results_dir: str | Path) -> Counter:
    """``ok``, ``failed``, ``skipped`` (and ``no_record``, included in ``failed``) of the jobs of the
    sweep in ``sweep_dir`` whose records are in ``results_dir`` (see the module docstring). A job
    whose saved config cannot be read is counted as ``failed`` with a warning on stderr."""
    store = ResultStore(results_dir)
    counts = Counter(ok=0, failed=0, skipped=0)
    written: dict[str, list[dict]] = {}  # job number -> the records this sweep's job wrote
    for record in store.records():
        sweep = record.get("sweep") or {}
        if sweep.get("dir") and _same_dir(sweep["dir"], sweep_dir) and sweep.get("job_num") is not None:
            written.setdefault(str(sweep["job_num"]), []).append(record)
    for job_config in sorted(Path(sweep_dir).glob("*/.hydra/config.yaml")):
        try:
            runs = store.of_setting(job_setting_id(job_config))
        except Exception as err:
            print(
                f"warning: sweep job config {job_config} not read ({type(err).__name__}: {err})",
                file=sys.stderr,
            )
            counts["failed"] += 1
            continue
        here = [r for r in runs if (d := (r.get("sweep") or {}).get("dir")) and _same_dir(d, sweep_dir)]
        if here:
            counts["ok" if any(r["status"] == "ok" for r in here) else "failed"] += 1
        elif mine := written.get(job_config.parent.parent.name):
            counts["ok" if all(r["status"] == "ok" for r in mine) else "failed"] += 1
        elif any(r["status"] == "ok" for r in runs):
            counts["skipped"] += 1
        elif (listed := _listed_runs(job_config.parent.parent)) and all(map(store.finished, listed)):
            counts["skipped"] += 1  # a grid job whose settings had all finished before
        else:
            counts["failed"] += 1
            counts["no_record"] += 1
    return counts


def summary_line(sweep_dir: str | Path, counts: Counter) -> str:
    """``sweep <dir>: N ok / M failed / K skipped`` (+ how many failed jobs left no record)."""
    line = f"sweep {sweep_dir}: {counts['ok']} ok / {counts['failed']} failed / {counts['skipped']} skipped"
    if counts["no_record"]:
        line += f" ({counts['no_record']} failed without a record: killed?)"
    return line


class SweepSummary(Callback):
    """Hydra callback: print :func:`summary_line` when a ``--multirun`` sweep ends (any launcher)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Count the sweep's jobs from its directory and the result store; never raises (a summary
        that cannot be made is one warning line)."""
        sweep_dir = config.hydra.sweep.dir
        try:
            print(summary_line(sweep_dir, sweep_counts(sweep_dir, config.paths.results_dir)), flush=True)
        except Exception as err:
            print(f"warning: no sweep summary ({type(err).__name__}: {err})", file=sys.stderr)
