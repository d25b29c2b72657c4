"""W&B logger: offline runs read back from their transaction log (tests/wandb_records.py).

Each test that creates a W&B run starts wandb's service (a few seconds); the pure parts (curves,
names, table rows, figures) are tested without it.
"""

from __future__ import annotations

import json
import sys

import pytest

from runners.output.wandb_logger import (
    SERIES,
    WandbLogger,
    prediction_rows,
    record_series,
    run_name,
    series_figure,
)
from runners.results.store import ResultStore
from tests.wandb_records import history_rows, offline_run

wandb = pytest.importorskip("wandb")

CONFIG = {
    "model": {"name": "smollm2-135m"},
    "method": {"_target_": "methods.zsmerge.ZSMerge", "residual_ratio": 2},
    "task": {"_target_": "tasks.xsum.XSum", "limit": 2},
    "runner": {"name": "quality"},
    "budget": 0.05,
    "budget_unit": "prompt",
    "seed": 0,
}
PRESETS = {"model": "smollm2-135m", "method": "zsmerge_xsum_paper", "task": "xsum", "runner": "quality"}


def quality_record() -> tuple[dict, list[dict]]:
    record = {
        "run_id": "0123456789abcdef",
        "status": "ok",
        "error": None,
        "method": "zsmerge",
        "task": "xsum",
        "config": CONFIG,
        "presets": PRESETS,
        "n_samples": 2,
        "metrics": {"rougeL": 12.5},
        "efficiency": {"decode_tokens_per_s": 40.0, "prefill_kept_fraction_per_layer": [0.2, 0.1, 0.05]},
    }
    predictions = [
        {"id": "a", "prediction": "a cat sat", "references": ["the cat sat"], "metrics": {"rougeL": 20.0}},
        {"id": "b", "prediction": "dogs", "references": ["a dog"], "metrics": {"rougeL": 5.0}},
    ]
    return record, predictions


def efficiency_record() -> dict:
    curve = [
        {"context": 512 + 128 * i, "step_ms": 20.0 + i, "tokens_per_s": 50.0 - i, "kv_bytes": 2**20 * (i + 1),
         "allocated_bytes": 2**21, "memory_bytes": 2**28}
        for i in range(4)
    ]  # fmt: skip
    config = CONFIG | {"task": None, "runner": {"name": "efficiency"}, "budget": 512}
    presets = PRESETS | {"method": "zsmerge", "task": "xsum", "runner": "efficiency"}
    fields = {"metrics": {"tokens_per_s": 48.0}, "curve": curve, "config": config, "presets": presets}
    return {"run_id": "fedcba9876543210", "status": "ok", "method": "zsmerge", "task": "synthetic"} | fields


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """wandb's own files (artifact staging, cache, settings) under ``tmp_path``, never in ``$HOME``."""
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return tmp_path


def test_a_quality_run_holds_predictions_history_figure_and_artifact(wandb_env):
    results = wandb_env / "results"
    record, predictions = quality_record()
    ResultStore(results).write(record, predictions)
    WandbLogger("kvbench-test", dir=str(results), results_dir=str(results)).log(record)

    run_dir, by_type = offline_run(results, record["run_id"])
    (run,) = by_type["run"]
    assert run.display_name == "zsmerge_xsum_paper@0.05 xsum smollm2-135m 01234567"
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["method"]["residual_ratio"] == 2 and config["budget"] == 0.05

    history = history_rows(by_type)
    kept = [row for row in history if "layer_kept/layer" in row]
    assert [(r["layer_kept/layer"], r["layer_kept/prefill_kept_fraction"]) for r in kept] == [
        (0, 0.2), (1, 0.1), (2, 0.05)
    ]  # fmt: skip
    metrics = {m.glob_name: m.step_metric for m in by_type["metric"] if m.glob_name}
    assert metrics["layer_kept/*"] == "layer_kept/layer"

    (table_row,) = [row for row in history if "predictions/_type" in row]
    assert table_row["predictions/_type"] == "table-file" and table_row["predictions/nrows"] == 2
    table = json.loads((run_dir / "files" / table_row["predictions/path"]).read_text())
    columns = table["columns"]
    rows = [dict(zip(columns, r, strict=True)) for r in table["data"]]
    assert [(r["id"], r["prediction"], r["metrics.rougeL"]) for r in rows] == [
        ("a", "a cat sat", 20.0), ("b", "dogs", 5.0)
    ]  # fmt: skip
    assert json.loads(rows[0]["references"]) == ["the cat sat"]

    (figure_row,) = [row for row in history if "figures/layer_kept/_type" in row]
    assert figure_row["figures/layer_kept/_type"] == "image-file"
    assert (run_dir / "files" / figure_row["figures/layer_kept/path"]).stat().st_size > 0

    artifact = next(a for a in by_type["artifact"] if a.type == "kvbench-run")
    assert artifact.name == "kvbench-0123456789abcdef"
    contents = {c.path: c.size for c in artifact.manifest.contents}
    store_dir = results / "runs" / record["run_id"]
    assert contents == {
        "record.json": (store_dir / "record.json").stat().st_size,
        "predictions.jsonl": (store_dir / "predictions.jsonl").stat().st_size,
    }
    updates = [u for s in by_type["summary"] for u in s.update]
    summary = {"/".join(u.nested_key) or u.key: json.loads(u.value_json) for u in updates}
    assert summary["rougeL"] == 12.5 and summary["status"] == "ok"


def test_an_efficiency_run_holds_its_context_curve(wandb_env):
    results = wandb_env / "results"
    record = efficiency_record()
    ResultStore(results).write(record, [])
    WandbLogger("kvbench-test", dir=str(results), results_dir=str(results)).log(record)
    _, by_type = offline_run(results, record["run_id"])
    assert by_type["run"][0].display_name == "zsmerge@512 efficiency smollm2-135m fedcba98"
    points = [row for row in history_rows(by_type) if "context/context" in row]
    assert [p["context/context"] for p in points] == [512, 640, 768, 896]
    assert [p["context/kv_bytes"] for p in points] == [c["kv_bytes"] for c in record["curve"]]
    assert {"context/tokens_per_s", "context/memory_bytes", "context/step_ms"} <= set(points[0])
    assert not [row for row in history_rows(by_type) if "predictions/_type" in row]  # no samples
    artifact = next(a for a in by_type["artifact"] if a.type == "kvbench-run")
    assert {c.path for c in artifact.manifest.contents} == {"record.json", "predictions.jsonl"}


def test_error_and_less_training_records_give_their_curves():
    error = {"error_analysis": {"budgets": [0.05, 0.1], "per_layer": [[0.3, 0.2], [0.1, 0.05]]}}
    (series,) = record_series(error)
    assert series.name == "layer_error" and series.rows == [
        {"layer": 0, "rel_error@0.05": 0.3, "rel_error@0.1": 0.1},
        {"layer": 1, "rel_error@0.05": 0.2, "rel_error@0.1": 0.05},
    ]
    less = {"curve": [{"epoch": 0, "train": None, "val": {0: 4.0, 1: 2.0}},
                      {"epoch": 1, "train": {0: 3.0, 1: 1.0}, "val": {0: 2.5, 1: 0.5}}]}  # fmt: skip
    (series,) = record_series(less)
    assert series.rows == [
        {"epoch": 0, "train_mse": None, "val_mse": 6.0},
        {"epoch": 1, "train_mse": 4.0, "val_mse": 3.0},
    ]
    assert record_series({"curve": []}) == [] and set(SERIES) >= {"context", "layer_error", "train_loss"}


def test_curve_figures_label_their_axes_with_units():
    (series,) = record_series(efficiency_record())
    fig = series_figure(series, "title")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["KV cache", "process / device memory", "decode throughput"]
    assert {ax.get_xlabel() for ax in axes} == {"context (tokens)"}
    assert [ax.get_ylabel() for ax in axes] == ["MiB", "MiB", "tokens/s"]
    kv = axes[0].get_lines()[0]
    assert list(kv.get_ydata()) == [1.0, 2.0, 3.0, 4.0]  # bytes drawn in MiB
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["K/V held", "buffers allocated"]
    assert all(ax.get_ylim()[0] == 0 for ax in axes)  # amounts drawn from zero


def test_run_names_carry_presets_and_fall_back_to_registry_names():
    record, _ = quality_record()
    assert run_name(record) == "zsmerge_xsum_paper@0.05 xsum smollm2-135m 01234567"
    old = {k: v for k, v in record.items() if k != "presets"} | {"config": CONFIG | {"budget": None}}
    assert run_name(old) == "zsmerge xsum smollm2-135m 01234567"


def test_prediction_rows_flatten_metrics_and_keep_every_column():
    columns, rows = prediction_rows([{"id": 1, "metrics": {"f1": 0.5}}, {"id": 2, "meta": {"len": 3}}])
    assert columns == ["id", "metrics.f1", "meta"]
    assert rows == [[1, 0.5, None], [2, None, '{"len": 3}']]


def test_without_wandb_installed_logging_is_a_warning(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    record, _ = quality_record()
    WandbLogger("kvbench-test", dir=str(tmp_path)).log(record)
    assert "warning: wandb is not installed" in capsys.readouterr().err
    assert not (tmp_path / "wandb").exists()
