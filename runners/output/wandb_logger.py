"""Weights & Biases logger: one W&B run per KVBench run record (offline by default).

What a run holds (README, "Weights & Biases"):

- config: the record's resolved config; summary: the record's flat row
  (``runners.results.store.flat_summary``);
- history: the record's curves (``runners.output.wandb_series.SERIES``), each under its own key prefix
  with its own x axis
  (``define_metric``): the efficiency runner's context-growth curve (``context/*`` vs
  ``context/context``), the error runner's per-layer errors (``layer_error/*`` vs
  ``layer_error/layer``), the quality runner's prompt share kept per layer, LESS training losses
  (``train_loss/*`` vs ``train_loss/epoch``);
- images: one small matplotlib figure per curve (``figures/<name>``);
- a table of the per-sample predictions (``predictions``, from ``runs/<id>/predictions.jsonl``);
- an artifact ``kvbench-<run id>`` (type ``kvbench-run``) holding ``record.json`` and
  ``predictions.jsonl``.

Run names carry the presets the run was composed from (``zsmerge_xsum_paper@0.05 xsum smollm2-135m
1a2b3c4d``). wandb missing is a warning; any W&B failure is reported by the caller
(``runners.output.record.log_record``) and never touches the stored record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runners.output.wandb_series import SERIES, Series, record_series, series_figure
from runners.results.store import flat_summary

__all__ = ["SERIES", "Series", "WandbLogger", "prediction_rows", "record_series", "run_name", "series_figure"]


def run_name(record: dict) -> str:
    """W&B run name: method preset and budget, task preset (runner for synthetic prompts), model
    preset, and the run id's first 8 digits: ``zsmerge_xsum_paper@0.05 xsum smollm2-135m 1a2b3c4d``.
    Records without ``presets`` (written before they were stored) use the registry names."""
    cfg = record.get("config") or {}
    presets = record.get("presets") or {}
    method = presets.get("method") or record.get("method") or "run"
    budget = cfg.get("budget")
    task = presets.get("task") if cfg.get("task") is not None else None
    task = task or record.get("task") or "-"
    if task == "synthetic":
        task = (cfg.get("runner") or {}).get("name") or task
    model = presets.get("model") or (cfg.get("model") or {}).get("name") or "-"
    head = method if budget is None else f"{method}@{budget}"
    return f"{head} {task} {model} {record['run_id'][:8]}"


def sweep_group(record: dict) -> str | None:
    """W&B group of a record: ``<experiment or "sweep">/<sweep dir name>`` for a multirun job."""
    sweep = record.get("sweep")
    if not sweep:
        return None
    return f"{sweep.get('experiment') or 'sweep'}/{Path(sweep['dir']).name}"


def _cell(value):
    """A W&B table cell: scalars as they are, lists and dicts as JSON text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def prediction_rows(predictions: list[dict]) -> tuple[list[str], list[list]]:
    """Columns and rows of the predictions table: every key of the per-sample lines (first-seen
    order), ``metrics`` flattened to ``metrics.<name>`` columns, nested values as JSON text."""
    flat = []
    for p in predictions:
        row = {k: v for k, v in p.items() if k != "metrics"}
        row |= {f"metrics.{k}": v for k, v in (p.get("metrics") or {}).items()}
        flat.append(row)
    columns = list(dict.fromkeys(k for row in flat for k in row))
    return columns, [[_cell(row.get(c)) for c in columns] for row in flat]


def read_predictions(path: Path) -> list[dict]:
    """The per-sample lines of ``predictions.jsonl`` (empty if the file is missing)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class WandbLogger:
    """One W&B run per KVBench run (offline by default), grouped by sweep (:func:`sweep_group`)
    unless ``group`` is set; see the module docstring for what it holds.

    Parameters
    ----------
    project : str
        W&B project.
    mode : str
        ``offline`` (default: ``<dir>/wandb``, ``wandb sync`` uploads later), ``online`` or ``disabled``.
    dir : str
        Where W&B writes its run directories (``<dir>/wandb``).
    group : str | None
        W&B group; None: the record's sweep.
    results_dir : str | None
        The result store holding ``runs/<id>/record.json`` and ``predictions.jsonl``; None: ``dir``.
    figures : bool
        Log a matplotlib figure per curve.

    Disabled with a warning when ``wandb`` is not installed.
    """

    def __init__(
        self,
        project: str,
        mode: str = "offline",
        dir: str = "results",
        group: str | None = None,
        results_dir: str | None = None,
        figures: bool = True,
    ) -> None:
        self.project, self.mode, self.dir, self.group = project, mode, dir, group
        self.results_dir = Path(results_dir or dir)
        self.figures = figures

    def log(self, record: dict) -> None:
        """Create, fill and finish a W&B run for ``record`` (the run is finished even when filling
        it fails; the error is raised to the caller)."""
        try:
            import wandb
        except ImportError:
            print("warning: wandb is not installed; W&B logging disabled", file=sys.stderr)
            return
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        name = run_name(record)
        run = wandb.init(
            project=self.project,
            mode=self.mode,
            dir=self.dir,
            name=name,
            id=record["run_id"],
            group=self.group or sweep_group(record),
            job_type=((record.get("config") or {}).get("runner") or {}).get("name"),
            config=record.get("config"),
            resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )
        try:
            self._fill(wandb, run, record, name)
        finally:
            run.finish()

    def _fill(self, wandb, run, record: dict, name: str) -> None:
        for series in record_series(record):
            run.define_metric(f"{series.name}/{series.x}")
            run.define_metric(f"{series.name}/*", step_metric=f"{series.name}/{series.x}")
            for row in series.rows:
                run.log({f"{series.name}/{k}": v for k, v in row.items() if v is not None})
            if self.figures:
                import matplotlib.pyplot as plt

                fig = series_figure(series, f"{name}\n{series.name}")
                run.log({f"figures/{series.name}": wandb.Image(fig)})
                plt.close(fig)
        run_dir = self.results_dir / "runs" / record["run_id"]
        predictions = read_predictions(run_dir / "predictions.jsonl")
        if predictions:
            columns, rows = prediction_rows(predictions)
            run.log({"predictions": wandb.Table(columns=columns, data=rows)})
        files = [p for p in (run_dir / "record.json", run_dir / "predictions.jsonl") if p.is_file()]
        if files:
            artifact = wandb.Artifact(
                f"kvbench-{record['run_id']}",
                type="kvbench-run",
                description=f"KVBench run record and per-sample predictions: {name}",
                metadata={"status": record.get("status"), "presets": record.get("presets")},
            )
            for path in files:
                artifact.add_file(str(path))
            run.log_artifact(artifact)
        run.summary.update({k: v for k, v in flat_summary(record).items() if v is not None})
