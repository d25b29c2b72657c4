"""Loggers fed from the run record: a local table (CSV + parquet); Weights & Biases is
``runners.wandb_logger.WandbLogger``."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runners.results import ResultStore, atomic_write_bytes, atomic_write_text


def flat_summary(record: dict) -> dict:
    """One flat row of a record: identity columns (model, method, task, runner, budget and its unit,
    seed), status and error, provenance (git sha, created), metrics and efficiency figures."""
    cfg = record.get("config") or {}
    row = {
        "run_id": record["run_id"],
        "status": record["status"],
        "error": record.get("error"),
        "model": (cfg.get("model") or {}).get("name"),
        "method": record.get("method"),
        "task": record.get("task"),
        "runner": (cfg.get("runner") or {}).get("name"),
        "budget": cfg.get("budget"),
        "budget_unit": cfg.get("budget_unit"),
        "seed": cfg.get("seed"),
        "n_samples": record.get("n_samples"),
        "git_sha": record.get("git_sha"),
        "created": record.get("created"),
    }
    row.update(record.get("metrics") or {})
    row.update({k: v for k, v in (record.get("efficiency") or {}).items() if not isinstance(v, list)})
    method_cfg = {k: v for k, v in (cfg.get("method") or {}).items() if k != "_target_"}
    row.update({f"method.{k}": v for k, v in method_cfg.items()})
    return row


def write_tables(results_dir: str | Path) -> Path:
    """Rebuild ``table.csv`` and ``table.parquet`` from every record of the store (the records are
    the source of truth; each file is replaced atomically through a uniquely named temp file, so
    concurrent writers never collide and a reader never sees a half-written table). Returns the
    CSV's path."""
    store = ResultStore(results_dir)
    frame = pd.DataFrame([flat_summary(r) for r in store.records()])
    atomic_write_text(store.root / "table.csv", frame.to_csv(index=False))
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(store.root / "table.parquet", buf.getvalue())
    return store.root / "table.csv"


class TableLogger:
    """Keeps ``table.csv`` / ``table.parquet`` in ``results_dir`` up to date with the records: after
    a single run, and once at the end of a ``--multirun`` sweep (:class:`TablesAtSweepEnd`, so a
    sweep of N jobs reads the store once, not N times); ``python -m reports table`` rebuilds them
    on demand (after a killed sweep)."""

    def __init__(self, results_dir: str) -> None:
        self.results_dir = results_dir

    def log(self, record: dict) -> None:
        """Rebuild the tables unless this process runs one job of a sweep."""
        from runners.record import in_multirun

        if not in_multirun():
            write_tables(self.results_dir)


class TablesAtSweepEnd(Callback):
    """Hydra callback: rebuild the result tables once when a ``--multirun`` sweep ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Rebuild the tables of the sweep's ``paths.results_dir`` if its logger keeps tables."""
        if "table" in (config.get("logger") or {}):
            write_tables(config.paths.results_dir)
