"""The runner registry and the entry point of ``run.py``."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable

from omegaconf import DictConfig

from kernels import KernelProofError, set_backend
from runners.generation.model_run import set_decode_backend
from runners.measure.attention_error import run_attention_error
from runners.measure.efficiency import run_efficiency
from runners.measure.oom import run_oom
from runners.output.record import in_multirun, record_failure
from runners.quality import run_quality
from runners.results.lock import holding_run_locks
from runners.setup.settings import RunSettings, read_settings
from runners.sweeps.quality_grid import run_quality_grid
from runners.train_less import run_train_less
from tasks.errors import KVBenchError

#: Runner name -> runner of a job's settings (``runners.setup.settings.read_settings``); each holds the
#: run locks it takes until it returns (``runners.results.lock``).
RUNNER_REGISTRY: dict[str, Callable[[RunSettings], dict]] = {
    name: holding_run_locks(runner)
    for name, runner in {
        "efficiency": run_efficiency,
        "error": run_attention_error,
        "oom": run_oom,
        "quality": run_quality,
        "quality_grid": run_quality_grid,
        "train_less": run_train_less,
    }.items()
}

#: Libraries whose INFO lines Hydra's job logging would print (it shows INFO from every logger):
#: absl's "Using default tokenizer." (rouge-score), matplotlib's font-cache lines.
QUIET_LOGGERS = ("absl", "matplotlib")


def quiet_library_loggers() -> None:
    """Show only warnings and errors from :data:`QUIET_LOGGERS` (KVBench's own lines are kept)."""
    import absl.logging  # noqa: F401  (absl's logger must be its own class before its level is set)

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def run_from_config(cfg: DictConfig) -> float | None:
    """Entry point of ``run.py``: run the configured runner.

    A single run stops on bad input with one ``error:`` line and exit code 2, and on a failed run
    (status ``oom``/``error``) with exit code 1. In a ``--multirun`` sweep every failure is recorded
    in the result store (status ``error`` or ``oom``) and the job returns None, so the sweep goes on
    and a sweeper (Optuna) sees a failed trial.

    Returns the metric a Hydra sweeper optimises: ``optimize_metric`` or the run's first metric
    (None for a failed run).

    Raises
    ------
    KVBenchError
        In a single run, if ``optimize_metric`` is not one of the run's metrics.
    """
    multirun = in_multirun()
    quiet_library_loggers()
    try:
        try:
            set_backend(cfg.get("kernels", "auto"))
            set_decode_backend(cfg.get("backend", "eager"))
        except ValueError as err:
            raise KVBenchError(str(err)) from err
        if cfg.runner.name not in RUNNER_REGISTRY:
            raise KVBenchError(f"unknown runner {cfg.runner.name!r} (known: {sorted(RUNNER_REGISTRY)})")
        record = RUNNER_REGISTRY[cfg.runner.name](read_settings(cfg))  # the door: cfg is read here
    except (KVBenchError, KernelProofError) as err:  # a kernel failing mid-run is recorded already
        print(f"error: {err}", file=sys.stderr)
        if not multirun:
            sys.exit(2)
        if not getattr(err, "kvbench_recorded", False):
            rid = record_failure(cfg, err)
            print(f"recorded as run {rid} (status error); the sweep goes on", file=sys.stderr)
        return None
    except Exception as err:
        if not multirun:
            raise
        traceback.print_exc()
        if not getattr(err, "kvbench_recorded", False):
            record_failure(cfg, err)
        return None
    if record["status"] != "ok":
        print(
            f"error: run {record['run_id']} ended with status {record['status']}: {record['error']}",
            file=sys.stderr,
        )
        if not multirun:
            sys.exit(1)
        return None
    metrics = record.get("metrics") or {}
    wanted = cfg.get("optimize_metric")
    if wanted is None:
        return next(iter(metrics.values()), None)
    if wanted not in metrics:
        message = f"optimize_metric {wanted!r} is not a metric of this run (metrics: {', '.join(metrics)})"
        if not multirun:
            raise KVBenchError(message)
        print(f"error: {message}", file=sys.stderr)
        return None
    return metrics[wanted]
