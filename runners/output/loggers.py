"""Loggers fed from the run record: a local table (CSV + parquet, ``runners.results.store.write_tables``);
Weights & Biases is ``runners.output.wandb_logger.WandbLogger``."""

from __future__ import annotations

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runners.results.store import write_tables


class TableLogger:
    """Keeps ``table.csv`` / ``table.parquet`` in ``results_dir`` up to date with the records: after
    a single run, and once at the end of a ``--multirun`` sweep (:class:`TablesAtSweepEnd`, so a
    sweep of N jobs reads the store once, not N times); ``python -m reports table`` rebuilds them
    on demand (after a killed sweep)."""

    def __init__(self, results_dir: str) -> None:
        self.results_dir = results_dir

    def log(self, record: dict) -> None:
        """Rebuild the tables unless this process runs one job of a sweep."""
        from runners.output.record import in_multirun

        if not in_multirun():
            write_tables(self.results_dir)


class TablesAtSweepEnd(Callback):
    """Hydra callback: rebuild the result tables once when a ``--multirun`` sweep ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Rebuild the tables of the sweep's ``paths.results_dir`` if its logger keeps tables."""
        if "table" in (config.get("logger") or {}):
            write_tables(config.paths.results_dir)
