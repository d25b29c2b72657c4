"""A fixture result store written with ResultStore as real runs write it: XSum quality runs (three
methods x three budgets + FullKV, per-sample ROUGE in predictions.jsonl), a needle grid, and
efficiency runs with context-growth curves. Scores are seeded random numbers."""

from __future__ import annotations

import json
import random

from reports.store import ResultStore, run_id

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


#: Per-sample ROUGE-1 of the store a user builds by running FullKV twice (:func:`unequal_store`):
#: sample id -> score. FullKV's third sample is far above the others, so a reference taken from
#: the 3-sample run moves the comparison.
UNEQUAL_SCORES = {
    "fullkv": {"0": 20.0, "1": 60.0, "2": 95.0},
    "h2o": {"0": 10.0, "1": 50.0},
    "zsmerge": {"0": 15.0, "1": 55.0},
    "kvmerger": {"0": 18.0, "1": 58.0},
}
KVMERGER_KEPT = 0.48


def unequal_store(root) -> ResultStore:
    """The store of a user who ran FullKV on 3 XSum samples and again on 2, then H2O and ZSMerge at
    10% and 20% and KVMerger (fixed theta: budget null, kept 48% of the prompt) on the same 2
    samples; predictions carry the sample ids, every per-sample score is ROUGE-1/2/L alike."""
    store = ResultStore(root)
    runs = [("fullkv", None, 3), ("fullkv", None, 2), ("kvmerger", None, 2)]
    runs += [(m, b, 2) for m in ("h2o", "zsmerge") for b in (0.1, 0.2)]
    for i, (method, budget, n) in enumerate(runs):
        shift = 0.0 if budget is None else 10 * budget
        scores = {k: v + shift for k, v in list(UNEQUAL_SCORES[method].items())[:n]}
        per = [{k: v for k in ("rouge1", "rouge2", "rougeL")} for v in scores.values()]
        mean = sum(scores.values()) / n
        kept = KVMERGER_KEPT if method == "kvmerger" else (budget or 1.0)
        xsum_run(
            store,
            method,
            budget,
            n,
            f"2026-11-20T14:{i:02d}:00+00:00",
            mean,
            efficiency={
                "kv_bytes_end_mean": 20e6 * kept,
                "fullkv_bytes_end_mean": 20e6,
                "prefill_kept_fraction": kept,
                "peak_rss_bytes": 9e8,
            },
            predictions=[
                {"id": k, "prediction": "x", "metrics": m} for k, m in zip(scores, per, strict=True)
            ],
        )
    return store


def unequal_niah_runs(store: ResultStore) -> list[dict]:
    """Needle grids of FullKV on samples a, b, c and on a, b, and ZSMerge at 10% on a, b."""
    task = {"_target_": "tasks.infinitebench.InfiniteBench", "tasks": ["passkey"], "lengths": [1000]}
    out = []
    for method, budget, ids in (("fullkv", None, "abc"), ("fullkv", None, "ab"), ("zsmerge", 0.1, "ab")):
        found = 100.0 if method == "fullkv" else 0.0
        out.append(
            write_run(
                store,
                config(method, budget, task | {"limit": len(ids)}, {"name": "quality"}),
                method,
                "infinitebench",
                "2026-11-20T15:00:00+00:00",
                metrics={"passkey": found, "passkey/len1000/depth0.5": found},
                predictions=[{"id": i, "prediction": "x", "metrics": {"score": found}} for i in ids],
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


def rerun_on_other_inputs(
    store: ResultStore, record: dict, created: str, data: str, factor: float = 0.5, status: str = "ok"
) -> dict:
    """``record``'s setting run again on other inputs (the task's data changed to version ``data``):
    the same config, stored under ``<setting id>-<inputs hash>`` and created at ``created``, on the
    same sample ids with every score and speed x ``factor`` (``status="error"``: a failed run)."""

    def scaled(values: dict) -> dict:
        return {k: v * factor if isinstance(v, float) and k != "context" else v for k, v in values.items()}

    path = store.run_dir(record["run_id"]) / "predictions.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    predictions = [p | {"metrics": scaled(p["metrics"])} for p in map(json.loads, lines)]
    inputs = {"model": {"name": record["config"]["model"]["name"]}, "data": data}
    rerun = record | {"run_id": run_id(record["config"], inputs), "inputs": inputs, "created": created}
    if status != "ok":
        rerun |= {"status": status, "error": "KVBenchError: the run failed", "metrics": {}}
        predictions = []
    else:
        rerun |= {key: scaled(record[key]) for key in ("metrics", "efficiency") if record.get(key)}
        rerun |= {"curve": [scaled(c) for c in record["curve"]]} if record.get("curve") else {}
    store.write(rerun, predictions)
    return rerun


def _ruler_config(method: str, ratio: float | None, limit: int, length: int) -> dict:
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
    out = []
    for i, ((method, ratio), values) in enumerate(scores.items()):
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
        limit = max(len(v) for v in by_task.values())
        cfg = _ruler_config(method, ratio, limit, 4096)
        metrics = {"avg": sum(means.values()) / len(means)} | means
        created = f"2026-11-21T10:{i:02d}:00+00:00"
        out.append(write_run(store, cfg, method, "ruler", created, metrics=metrics, predictions=preds))
    return out


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
