"""Fixture records for the experiment reports' tests: every sweep job of an experiment written with
the numbers its report reads (seeded by run id), and small XSum quality runs."""

from __future__ import annotations

import hashlib

from runners.results.store import ResultStore
from runners.sweeps.experiment_jobs import sweep_jobs


def fake_value(run_id: str, key: str) -> float:
    """A deterministic number in [0, 100) per (run, key)."""
    return int(hashlib.sha256(f"{run_id}/{key}".encode()).hexdigest()[:8], 16) % 10000 / 100


def fixture_record(job, spec) -> dict:
    """A finished record for a sweep job with every number its report reads."""
    rid = job.run_id
    keys = list(spec.get("values") or spec.get("metrics") or [])
    metrics = {k: fake_value(rid, k) for k in keys}
    analysis = None
    if spec.kind == "error":
        budgets = list(job.cfg.runner.budgets)
        metrics = {f"rel_error@{b}": fake_value(rid, str(b)) / 100 + 1e-3 for b in budgets}
        means = [metrics[f"rel_error@{b}"] for b in budgets]
        analysis = {"budgets": budgets, "mean": means, "per_layer": [[m / 2, m, 3 * m / 2] for m in means]}
    record = {
        "run_id": rid,
        "status": "ok",
        "error": None,
        "config": job.config,
        "method": job.name("method"),
        "task": job.name("task") or "synthetic",
        "metrics": metrics,
        "efficiency": {k: v for k, v in metrics.items()},
        "n_samples": 2,
    }
    if analysis:
        record["error_analysis"] = analysis
    if spec.kind == "curve":
        record["curve"] = [
            {"context": c, "tokens_per_s": fake_value(rid, str(c)), "memory_bytes": c * 2**20}
            for c in (600, 700)
        ]
    return record


def fill(store: ResultStore, experiment: str, scale: str = "smoke", overrides=(), skip=()) -> dict[str, dict]:
    base, jobs = sweep_jobs(experiment, scale, overrides)
    written = {}
    for job in jobs:
        if job.run_id in written or job.run_id in skip:
            continue
        written[job.run_id] = fixture_record(job, base.report)
        store.write(written[job.run_id], [])
    return written


def write_quality(store: ResultStore, rid: str, method: str, budget, scores: list[float], task="xsum"):
    record = {
        "run_id": rid, "status": "ok", "method": method, "task": task,
        "config": {"model": {"name": "m"}, "budget": budget, "budget_unit": "prompt",
                   "runner": {"name": "quality"}, "method": {}},
        "metrics": {"rouge1": sum(scores) / len(scores)},
    }  # fmt: skip
    store.write(record, [{"id": i, "metrics": {"rouge1": s, "rouge2": 0.0}} for i, s in enumerate(scores)])
