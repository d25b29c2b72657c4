"""The runner registry and the entry point of ``run.py``."""

from __future__ import annotations

import sys
from collections.abc import Callable

from omegaconf import DictConfig

from runners.efficiency import run_efficiency
from runners.error import run_error
from runners.errors import KVBenchError
from runners.less_train import run_train_less
from runners.oom import run_oom
from runners.quality import run_quality

RUNNER_REGISTRY: dict[str, Callable[[DictConfig], dict]] = {
    "efficiency": run_efficiency,
    "error": run_error,
    "oom": run_oom,
    "quality": run_quality,
    "train_less": run_train_less,
}


def run_from_config(cfg: DictConfig) -> float | None:
    """Entry point of ``run.py``: run the configured runner; bad input -> one line, exit 2.

    Returns the run's first quality metric (what a Hydra sweeper optimises), or None.
    """
    try:
        if cfg.runner.name not in RUNNER_REGISTRY:
            raise KVBenchError(f"unknown runner {cfg.runner.name!r} (known: {sorted(RUNNER_REGISTRY)})")
        record = RUNNER_REGISTRY[cfg.runner.name](cfg)
    except KVBenchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if record["status"] != "ok":
        print(
            f"error: run {record['run_id']} ended with status {record['status']}: {record['error']}",
            file=sys.stderr,
        )
        sys.exit(1)
    metrics = record.get("metrics") or {}
    return next(iter(metrics.values()), None)
