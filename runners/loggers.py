"""Loggers fed from the run record: a local table (CSV + parquet) and Weights & Biases."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pandas as pd

from runners.results import ResultStore, atomic_write_text


def flat_summary(record: dict) -> dict:
    """One flat row of a record: identity columns, status, metrics and efficiency figures."""
    cfg = record.get("config", {})
    row = {
        "run_id": record["run_id"],
        "status": record["status"],
        "model": cfg.get("model", {}).get("name"),
        "method": record.get("method"),
        "task": record.get("task"),
        "budget": cfg.get("budget"),
        "n_samples": record.get("n_samples"),
        "created": record.get("created"),
    }
    row.update(record.get("metrics") or {})
    row.update({k: v for k, v in (record.get("efficiency") or {}).items() if not isinstance(v, list)})
    method_cfg = {k: v for k, v in (cfg.get("method") or {}).items() if k != "_target_"}
    row.update({f"method.{k}": v for k, v in method_cfg.items()})
    return row


class TableLogger:
    """Rewrites ``table.csv`` and ``table.parquet`` in ``results_dir`` from every stored record."""

    def __init__(self, results_dir: str) -> None:
        self.store = ResultStore(results_dir)

    def log(self, record: dict) -> None:
        """Regenerate the tables (atomically) including ``record``."""
        frame = pd.DataFrame([flat_summary(r) for r in self.store.records()])
        atomic_write_text(self.store.root / "table.csv", frame.to_csv(index=False))
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        tmp = self.store.root / ".table.parquet.tmp"
        tmp.write_bytes(buf.getvalue())
        tmp.replace(self.store.root / "table.parquet")


def sweep_group(record: dict) -> str | None:
    """W&B group of a record: ``<experiment or "sweep">/<sweep dir name>`` for a multirun job."""
    sweep = record.get("sweep")
    if not sweep:
        return None
    return f"{sweep.get('experiment') or 'sweep'}/{Path(sweep['dir']).name}"


class WandbLogger:
    """One W&B run per KVBench run, with the record's config and summary (offline by default),
    grouped by sweep (:func:`sweep_group`) unless ``group`` is set.

    Disabled with a warning when ``wandb`` is not installed.
    """

    def __init__(self, project: str, mode: str = "offline", dir: str = "results", group: str | None = None):
        self.project, self.mode, self.dir, self.group = project, mode, dir, group

    def log(self, record: dict) -> None:
        """Create, fill and finish a W&B run for ``record``."""
        try:
            import wandb
        except ImportError:
            print("warning: wandb is not installed; W&B logging disabled", file=sys.stderr)
            return
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=self.project,
            mode=self.mode,
            dir=self.dir,
            name=f"{record.get('method')}-{record.get('task')}-{record['run_id'][:8]}",
            id=record["run_id"],
            group=self.group or sweep_group(record),
            job_type=(record.get("config") or {}).get("runner", {}).get("name"),
            config=record.get("config"),
            resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )
        run.summary.update({k: v for k, v in flat_summary(record).items() if v is not None})
        run.finish()
