"""Weights & Biases logger: one W&B run per KVBench run record (offline by default).

What a run holds (README, "Weights & Biases"):

- config: the record's resolved config; summary: the record's flat row (``runners.loggers.flat_summary``);
- history: the record's curves (:data:`SERIES`), each under its own key prefix with its own x axis
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
(``runners.record.log_record``) and never touches the stored record.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runners.loggers import flat_summary

MIB = 2**20
#: Legend names of the curves' y keys (others are shown as they are; ``rel_error@<b>`` as ``budget <b>``).
LEGEND = {
    "kv_bytes": "K/V held",
    "allocated_bytes": "buffers allocated",
    "train_mse": "train",
    "val_mse": "validation",
}


@dataclass
class Series:
    """One curve of a record: rows that share an x key.

    Attributes
    ----------
    name : str
        W&B key prefix (``<name>/<key>``) and figure name.
    x : str
        The x key of every row.
    rows : list[dict]
        One dict per point: ``x`` and the y values (numbers or None).
    panels : dict[str, tuple[list[str], str, float]]
        Figure panels: title -> (y keys drawn, axis label with unit, divisor applied to the values).
    x_label : str
        X axis label with unit.
    """

    name: str
    x: str
    rows: list[dict]
    panels: dict[str, tuple[list[str], str, float]] = field(default_factory=dict)
    x_label: str = ""


def context_curve(record: dict) -> Series | None:
    """The efficiency runner's context-growth points (``record["curve"]``; ZSMerge Figure 3): KV
    bytes, memory, step latency and tokens/s vs context (tokens)."""
    curve = record.get("curve")
    if not isinstance(curve, list) or not curve or "context" not in curve[0]:
        return None
    return Series(
        "context",
        "context",
        [dict(point) for point in curve],
        {
            "KV cache": (["kv_bytes", "allocated_bytes"], "MiB", MIB),
            "process / device memory": (["memory_bytes"], "MiB", MIB),
            "decode throughput": (["tokens_per_s"], "tokens/s", 1.0),
        },
        "context (tokens)",
    )


def layer_errors(record: dict) -> Series | None:
    """The error runner's relative attention-output error per layer, one key per budget
    (``rel_error@<budget>``; ZSMerge Figure 4 by layer)."""
    analysis = record.get("error_analysis")
    if not analysis or not analysis.get("per_layer"):
        return None
    keys = [f"rel_error@{b}" for b in analysis["budgets"]]
    layers = len(analysis["per_layer"][0])
    rows = [
        {"layer": i} | {k: row[i] for k, row in zip(keys, analysis["per_layer"], strict=True)}
        for i in range(layers)
    ]
    return Series(
        "layer_error",
        "layer",
        rows,
        {"relative error vs FullKV": (keys, "||o_c - o|| / ||o|| (unitless)", 1.0)},
        "decoder layer",
    )


def kept_per_layer(record: dict) -> Series | None:
    """The quality runner's share of each prompt kept after prefill, per layer (mean over samples)."""
    kept = (record.get("efficiency") or {}).get("prefill_kept_fraction_per_layer")
    if not kept:
        return None
    rows = [{"layer": i, "prefill_kept_fraction": v} for i, v in enumerate(kept)]
    return Series(
        "layer_kept",
        "layer",
        rows,
        {"prompt kept after prefill": (["prefill_kept_fraction"], "fraction of prompt tokens", 1.0)},
        "decoder layer",
    )


def training_loss(record: dict) -> Series | None:
    """LESS training (``runner=train_less``): train and validation MSE per epoch, summed over the
    trained layers (epoch 0: the untrained kernels' validation loss)."""
    curve = record.get("curve")
    if not isinstance(curve, list) or not curve or "epoch" not in curve[0]:
        return None
    rows = [
        {
            "epoch": point["epoch"],
            "train_mse": sum(point["train"].values()) if point.get("train") else None,
            "val_mse": sum(point["val"].values()) if point.get("val") else None,
        }
        for point in curve
    ]
    return Series(
        "train_loss",
        "epoch",
        rows,
        {"LESS kernels": (["train_mse", "val_mse"], "MSE, sum over layers", 1.0)},
        "epoch",
    )


#: Curve extractors: each returns the series a record holds, or None.
SERIES: dict[str, Callable[[dict], Series | None]] = {
    "context": context_curve,
    "layer_error": layer_errors,
    "layer_kept": kept_per_layer,
    "train_loss": training_loss,
}


def record_series(record: dict) -> list[Series]:
    """Every curve of ``record`` (:data:`SERIES`)."""
    return [s for extract in SERIES.values() if (s := extract(record)) is not None]


def series_figure(series: Series, title: str):
    """A small matplotlib figure of one series: one panel per entry of ``series.panels``, y values
    divided by the panel's divisor, labelled axes with units. Returns the ``Figure``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = {
        t: p for t, p in series.panels.items() if any(r.get(k) is not None for r in series.rows for k in p[0])
    }
    width = max(4.2 * len(panels), 5.6)  # room for the title of a one-panel figure
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(width, 3.4), squeeze=False)
    for ax, (panel, (keys, unit, scale)) in zip(axes[0], panels.items(), strict=False):
        for key in keys:
            points = [(r[series.x], r[key] / scale) for r in series.rows if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                label = LEGEND.get(key) or key.replace("rel_error@", "budget ")
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(series.x_label or series.x)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        low, high = ax.get_ylim()
        if low > 0:  # amounts: the axis starts at zero, with the usual headroom above
            ax.set_ylim(0, 1.05 * high)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


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
