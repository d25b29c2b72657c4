"""RULER runs for the report tests, written with ResultStore as real runs write them: seeded scores by
a method's strength (:func:`ruler_runs`) or given per sample (:func:`ruler_scored`)."""

from __future__ import annotations

import random

from runners.results.store import ResultStore
from tests.report_fixtures import config, write_run

#: RULER tasks of :func:`ruler_runs` (four of the thirteen keep the tests small).
RULER_TASKS = ("niah_single_1", "niah_multikey_1", "vt", "qa_1")
#: How much of RULER each method keeps at compression ratio 1 (0: collapses, 1: no loss).
RULER_STRENGTH = {
    "snapkv": 0.5,
    "adakv_snapkv": 0.7,
    "expected_attention": 0.6,
    "knorm": 0.2,
    "streamingllm": 0.1,
    "random": 0.0,
    "tova": 0.4,
    "pyramidkv": 0.45,
}


def ruler_runs(
    store: ResultStore,
    methods: tuple[str, ...] = ("snapkv", "adakv_snapkv"),
    ratios: tuple[float, ...] = (0.25, 0.5),
    per_task: int = 2,
    length: int = 4096,
    query_aware: bool = False,
    tasks: tuple[str, ...] = RULER_TASKS,
    model: str = "smollm2-135m",
    first_id: int = 0,
) -> list[dict]:
    """FullKV and ``methods`` at ``ratios`` (budget ``1 - ratio``, as ``compression_ratio=``
    gives it) on ``per_task`` samples of each task at one ``length``; sample ids start at
    ``first_id``. A sample scores 100 with probability ``1 - ratio * (1 - strength)`` (seeded)."""
    from reports.presets import presets

    runs = [("fullkv", None)] + [(m, r) for m in methods for r in ratios]
    out = []
    for i, (method, ratio) in enumerate(runs):
        rng = random.Random(f"{method}-{ratio}-{length}-{query_aware}-{first_id}")
        hit = 1.0 if ratio is None else 1 - ratio * (1 - RULER_STRENGTH.get(method, 0.5))
        preds = [
            {
                "id": f"{t}-len{length}-{k}",
                "prediction": "x",
                "meta": {"task": t, "length": length},
                "metrics": {"score": 100.0 * (rng.random() < hit), "task": t},
            }
            for t in tasks
            for k in range(first_id, first_id + per_task)
        ]
        scores = {
            t: sum(p["metrics"]["score"] for p in preds if p["meta"]["task"] == t) / per_task for t in tasks
        }
        task = {
            "_target_": "tasks.ruler.Ruler",
            "lengths": [length],
            "limit": per_task,
            "query_aware": query_aware,
        }
        cfg = config("fullkv", None, task, {"name": "quality"}) | {
            "model": {"name": model},
            "method": presets()[method],
            "budget": None if ratio is None else 1 - ratio,
            "compression_ratio": ratio,
        }
        out.append(
            write_run(
                store,
                cfg,
                method,
                "ruler",
                f"2026-11-20T16:{i:02d}:00+00:00",
                metrics={"avg": sum(scores.values()) / len(scores)} | scores,
                predictions=preds,
                efficiency={"kv_bytes_end_mean": 20e6 * (1 - (ratio or 0)), "fullkv_bytes_end_mean": 20e6}
                | ({} if ratio is None else {"kv_fraction_of_fullkv": 1 - ratio}),
            )
        )
    return out


def ruler_config(method: str, ratio: float | None, limit: int, length: int) -> dict:
    """The config of a query-agnostic RULER run of ``method`` at ``ratio`` (None: FullKV), ``limit``
    samples per task at ``length`` tokens."""
    from reports.presets import presets

    task = {"_target_": "tasks.ruler.Ruler", "lengths": [length], "limit": limit, "query_aware": False}
    return config("fullkv", None, task, {"name": "quality"}) | {
        "method": presets()[method],
        "budget": None if ratio is None else 1 - ratio,
        "compression_ratio": ratio,
    }


def ruler_scored(store: ResultStore, scores: dict[tuple[str, float | None], dict[str, float]]) -> list[dict]:
    """RULER runs at 4,096 tokens with the given per-sample scores: ``(method, ratio) -> sample id ->
    score`` (ratio None for FullKV); a sample's task is its id up to the last ``-`` (``vt-3``). The
    record's metrics are RULER's: each task's mean and ``avg``, their mean."""
    return [
        ruler_scored_run(store, method, ratio, values, f"2026-11-21T10:{i:02d}:00+00:00")
        for i, ((method, ratio), values) in enumerate(scores.items())
    ]


def ruler_scored_run(
    store: ResultStore,
    method: str,
    ratio: float | None,
    values: dict[str, float],
    created: str,
    config: dict | None = None,
    **fields,
) -> dict:
    """One run of :func:`ruler_scored`, its config updated with ``config`` (``quant``, ``task``) and
    its record with ``fields`` (``protocol``)."""
    preds = [
        {
            "id": sid,
            "prediction": "x",
            "meta": {"task": sid.rsplit("-", 1)[0], "length": 4096},
            "metrics": {"score": value, "task": sid.rsplit("-", 1)[0]},
        }
        for sid, value in values.items()
    ]
    by_task: dict[str, list[float]] = {}
    for p in preds:
        by_task.setdefault(p["meta"]["task"], []).append(p["metrics"]["score"])
    means = {t: sum(v) / len(v) for t, v in by_task.items()}
    cfg = ruler_config(method, ratio, max(len(v) for v in by_task.values()), 4096) | (config or {})
    metrics = {"avg": sum(means.values()) / len(means)} | means
    return write_run(store, cfg, method, "ruler", created, metrics=metrics, predictions=preds, **fields)
