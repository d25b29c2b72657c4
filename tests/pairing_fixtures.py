"""Stores whose runs do not pair one to one, for the report tests: a user's FullKV run on 3 samples and
again on 2 beside methods on those 2 (:func:`unequal_store`, :func:`unequal_niah_runs`), and a setting
run again on other inputs (:func:`rerun_on_other_inputs`); :func:`caption` reads a figure's caption."""

from __future__ import annotations

import json

from runners.results.store import ResultStore, run_id
from tests.report_fixtures import config, write_run, xsum_run

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


def caption(fig) -> str:
    return " ".join(" ".join(t.get_text() for t in fig.texts).split())
