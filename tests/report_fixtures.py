"""A fixture result store written with ResultStore as real runs write it: XSum quality runs (three
methods x three budgets + FullKV, per-sample ROUGE in predictions.jsonl), a needle grid, and
efficiency runs with context-growth curves. Scores are seeded random numbers. :func:`check_latex`
checks a LaTeX table's shape."""

from __future__ import annotations

import random
import re

from runners.results.store import ResultStore, run_id

PRESETS = {
    "fullkv": {"_target_": "methods.fullkv.FullKV"},
    "h2o": {
        "_target_": "methods.h2o.H2O",
        "heavy_ratio": 0.5,
        "recent_ratio": 0.5,
        "chunk_size": 256,
        "state_rank": 0,
    },
    "zsmerge": {
        "_target_": "methods.zsmerge.ZSMerge",
        "proximity_ratio": 0.5,
        "residual_ratio": 0.02,
        "alpha": 1.0,
        "lam": 0.98,
        "window_size": 8,
        "pool_kernel": 5,
        "order": "code",
    },
    "kvmerger": {
        "_target_": "methods.kvmerger.KVMerger",
        "recent_ratio": 0.17,
        "heavy_ratio": 0.12,
        "theta": 0.75,
        "exact_budget": False,
        "chunk_size": 256,
    },
    "snapkv": {
        "_target_": "methods.snapkv.SnapKV",
        "window_size": 32,
        "kernel_size": 7,
        "pooling": "max",
        "decode_budget": False,
    },
}
BUDGETS = (0.05, 0.1, 0.2)
#: Methods whose stored budget is null (``budget_applies`` False): FullKV, KVMerger at a fixed theta.
BUDGET_IGNORED = ("fullkv", "kvmerger")
N_SAMPLES = 12


def config(
    method: str, budget, task: dict | None, runner: dict, budget_unit: str = "prompt", **method_cfg
) -> dict:
    """A resolved run config as run.py stores it."""
    return {
        "model": {"name": "smollm2-135m"},
        "method": PRESETS[method] | method_cfg,
        "task": task,
        "runner": runner,
        "budget": None if method in BUDGET_IGNORED else budget,
        "budget_unit": budget_unit,
        "seed": 0,
    }


def write_run(store: ResultStore, cfg: dict, method: str, task: str, created: str, **fields) -> dict:
    """Write one record (and its predictions) with a run id from its config; returns the record."""
    predictions = fields.pop("predictions", [])
    record = {
        "run_id": run_id(cfg),
        "status": "ok",
        "error": None,
        "created": created,
        "config": cfg,
        "method": method,
        "task": task,
        "n_samples": len(predictions) or None,
        "samples_done": len(predictions) or None,
    } | fields
    store.write(record, predictions)
    return record


def xsum_run(
    store: ResultStore, method: str, budget: float | None, n: int, created: str, mean: float, **fields
) -> dict:
    """One finished XSum quality run of ``n`` samples whose mean ROUGE-1, ROUGE-2 and ROUGE-L are all
    ``mean``; ``fields`` as :func:`write_run`."""
    task = {"_target_": "tasks.xsum.XSum", "limit": n, "max_new_tokens": 64}
    metrics = {"rouge1": mean, "rouge2": mean, "rougeL": mean}
    cfg = config(method, budget, task, {"name": "quality"})
    return write_run(store, cfg, method, "xsum", created, metrics=metrics, **fields)


def quality_runs(
    store: ResultStore, n: int = N_SAMPLES, budget_unit: str = "prompt", minute: int = 0
) -> list[dict]:
    """FullKV and h2o/zsmerge/snapkv at three budgets on XSum; ROUGE grows with the budget."""
    rng = random.Random(0)
    task = {"_target_": "tasks.xsum.XSum", "limit": n, "max_new_tokens": 64}
    records = []
    for i, (method, budget) in enumerate(
        [("fullkv", None)] + [(m, b) for m in ("h2o", "zsmerge", "snapkv") for b in BUDGETS]
    ):
        level = 30.0 if budget is None else 12 + 60 * budget + (3 if method == "zsmerge" else 0)
        scores = [
            {
                "rouge1": max(0.0, rng.gauss(level, 6)),
                "rouge2": max(0.0, rng.gauss(level / 3, 2)),
                "rougeL": max(0.0, rng.gauss(level * 0.8, 5)),
            }
            for _ in range(n)
        ]
        metrics = {k: sum(s[k] for s in scores) / n for k in ("rouge1", "rouge2", "rougeL")}
        kv = 20e6 * (1 if budget is None else budget)
        records.append(
            write_run(
                store,
                config(method, budget, task, {"name": "quality"}, budget_unit),
                method,
                "xsum",
                f"2026-11-20T10:{minute + i:02d}:00+00:00",
                metrics=metrics,
                efficiency={
                    "kv_bytes_end_mean": kv,
                    "fullkv_bytes_end_mean": 20e6,
                    "peak_rss_bytes": 9e8 + kv,
                    "peak_device_bytes": None,
                },
                predictions=[{"id": str(k), "prediction": "x", "metrics": s} for k, s in enumerate(scores)],
            )
        )
    return records


def error_run(store: ResultStore) -> dict:
    """A failed XSum run (status error) that reports must list, not score."""
    task = {"_target_": "tasks.xsum.XSum", "limit": N_SAMPLES, "max_new_tokens": 64}
    cfg = config("h2o", 0.5, task, {"name": "quality"})
    return write_run(
        store,
        cfg,
        "h2o",
        "xsum",
        "2026-11-20T11:00:00+00:00",
        status="error",
        error="KVBenchError: something broke " + "x" * 200,
    )


def niah_runs(store: ResultStore) -> list[dict]:
    """A 2 x 3 needle grid for FullKV (all found) and ZSMerge at 10% (deep needles lost)."""
    task = {
        "_target_": "tasks.infinitebench.InfiniteBench",
        "tasks": ["passkey"],
        "generate": True,
        "lengths": [1000, 2000],
        "depths": [0.1, 0.5, 0.9],
        "samples_per_cell": 1,
    }
    out = []
    for method, budget in (("fullkv", None), ("zsmerge", 0.1)):
        metrics = {"avg": 0.0, "passkey": 0.0}
        for length in (1000, 2000):
            for depth in (0.1, 0.5, 0.9):
                found = method == "fullkv" or depth > 0.4
                metrics[f"passkey/len{length}/depth{depth:g}"] = 100.0 if found else 0.0
        out.append(
            write_run(
                store,
                config(method, budget, task, {"name": "quality"}),
                method,
                "infinitebench",
                "2026-11-20T12:00:00+00:00",
                metrics=metrics,
            )
        )
    return out


def efficiency_runs(store: ResultStore) -> list[dict]:
    """FullKV and ZSMerge at 64 slots, 128-token prompts grown to 384 tokens (curve every 64)."""
    out = []
    for method in ("fullkv", "zsmerge"):
        runner = {"name": "efficiency", "prompt_len": 128, "gen_len": 256, "batch_size": 1, "curve_every": 64}
        curve = []
        for context in (192, 256, 320, 384):
            kv = 9216 * (context if method == "fullkv" else 65)
            curve.append(
                {
                    "context": context,
                    "step_ms": 20.0,
                    "tokens_per_s": 50.0 - context / 100,
                    "kv_bytes": kv,
                    "allocated_bytes": kv,
                    "memory_bytes": 8e8 + kv,
                }
            )
        eff = {
            "kv_bytes_end": curve[-1]["kv_bytes"],
            "allocated_kv_bytes_end": curve[-1]["allocated_bytes"],
            "fullkv_bytes_end": 9216 * 384,
            "peak_memory_bytes": 9e8,
            "decode_tokens_per_s": 46.0,
            "tokens_per_s": 40.0,
            "latency_seconds": 6.4,
        }
        out.append(
            write_run(
                store,
                config(method, 64, None, runner),
                method,
                "synthetic",
                "2026-11-20T13:00:00+00:00",
                metrics={"tokens_per_s": 40.0},
                efficiency=eff,
                curve=curve,
                shape={"prompt_len": 128, "gen_len": 256, "batch_size": 1},
                device={"type": "cpu", "name": "x86_64"},
            )
        )
    return out


def full_store(root) -> ResultStore:
    """A store with every fixture: quality (plus a failed run), needle and efficiency runs."""
    store = ResultStore(root)
    quality_runs(store)
    error_run(store)
    niah_runs(store)
    efficiency_runs(store)
    return store


def xsum_scored(store: ResultStore, scores: dict[tuple[str, float | None], dict[str, float]]) -> list[dict]:
    """XSum runs with the given per-sample ROUGE-1 (ROUGE-2 and ROUGE-L alike): ``(method, budget)
    -> sample id -> score`` (budget None for FullKV)."""
    out = []
    for i, ((method, budget), values) in enumerate(scores.items()):
        per = {sid: {k: v for k in ("rouge1", "rouge2", "rougeL")} for sid, v in values.items()}
        mean = sum(values.values()) / len(values)
        out.append(
            xsum_run(
                store,
                method,
                budget,
                len(values),
                f"2026-11-21T11:{i:02d}:00+00:00",
                mean,
                efficiency={"kv_bytes_end_mean": 1e6, "fullkv_bytes_end_mean": 2e6, "peak_rss_bytes": 9e8},
                predictions=[{"id": sid, "prediction": "x", "metrics": m} for sid, m in per.items()],
            )
        )
    return out


def check_latex(text: str, columns: int) -> None:
    envs = re.findall(r"\\(begin|end)\{(\w+\*?)\}", text)
    stack = []
    for kind, name in envs:
        if kind == "begin":
            stack.append(name)
        else:
            assert stack.pop() == name
    assert not stack
    for rule in ("\\toprule", "\\midrule", "\\bottomrule"):
        assert text.count(rule) == 1
    spec = re.search(r"\\begin\{tabular\}\{([lrc]+)\}", text).group(1)
    assert len(spec) == columns
    body = text.split("\\toprule")[1].split("\\bottomrule")[0]
    for line in body.splitlines():
        if line.endswith("\\\\"):
            spans = [int(n) for n in re.findall(r"\\multicolumn\{(\d+)\}", line)]
            cells = line.removesuffix("\\\\").split(" & ")
            assert len(cells) - len(spans) + sum(spans) == columns, line
