"""``python -m reports summary``: methods ranked per budget across every task run so far, with
bootstrap confidence intervals over samples (the papers report none).

For every finished quality run the task's primary metric (the first of the record's metrics) is
re-averaged from the per-sample scores in ``predictions.jsonl`` and resampled (scipy's
percentile bootstrap, 95%). Within each (model, task, budget) methods are ranked by mean (1 = best;
FullKV, which ignores the budget, joins every budget of its model and task as a reference); a
method's summary rank is its mean rank over the tasks it ran.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from reports.frame import label
from reports.runs import SMALL_N, row
from reports.store import ResultStore

CONFIDENCE = 0.95


def sample_scores(store: ResultStore, record: dict) -> tuple[str, list[float]]:
    """The primary metric of a quality record and its per-sample values (``predictions.jsonl``)."""
    metric = next(iter(record.get("metrics") or {}), None)
    path = store.run_dir(record["run_id"]) / "predictions.jsonl"
    if metric is None or not path.is_file():
        return metric or "", []
    scores = []
    for line in path.read_text(encoding="utf-8").splitlines():
        per = json.loads(line).get("metrics") or {}
        value = per.get(metric, next(iter(per.values()), None))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scores.append(float(value))
    return metric, scores


def interval(scores: list[float], n_resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap 95% confidence interval of the mean (NaN for fewer than 2 samples)."""
    if len(scores) < 2:
        return math.nan, math.nan
    if len(set(scores)) == 1:
        return scores[0], scores[0]
    res = bootstrap(
        (np.asarray(scores),), np.mean, n_resamples=n_resamples, confidence_level=CONFIDENCE,
        method="percentile", rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def scored_runs(store: ResultStore, n_resamples: int = 1000) -> pd.DataFrame:
    """One row per finished quality run with per-sample scores: model, task, budget, method label,
    metric, n, mean, CI bounds. Of several runs with the same (model, task, budget, label) the one
    with most samples is kept."""
    rows = []
    for rec in store.records():
        cfg = rec.get("config") or {}
        if rec.get("status") != "ok" or (cfg.get("runner") or {}).get("name") != "quality":
            continue
        metric, scores = sample_scores(store, rec)
        if not scores:
            continue
        low, high = interval(scores, n_resamples)
        info = row(rec)
        rows.append({
            "model": cfg["model"]["name"], "task": rec["task"], "budget": label(cfg.get("budget")),
            "budget_unit": info["budget_unit"], "method": info["label"],
            "metric": metric, "n": len(scores), "mean": float(np.mean(scores)), "low": low, "high": high,
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    keys = ["model", "task", "budget", "budget_unit", "method"]
    return frame.sort_values("n").drop_duplicates(keys, keep="last").sort_values(keys).reset_index(drop=True)


def ranking(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per budget, methods by mean rank over tasks; cells ``mean [low, high]`` per (task, model)."""
    if runs.empty:
        return {}
    reference = runs[runs["budget"] == "none"]
    reference = reference.assign(method=reference["method"] + " (reference)")
    tables = {}
    for budget in sorted(set(runs["budget"]) - {"none"}, key=_budget_order):
        part = pd.concat([runs[runs["budget"] == budget], reference])
        part = part[part.set_index(["model", "task"]).index.isin(
            runs[runs["budget"] == budget].set_index(["model", "task"]).index
        )]  # fmt: skip
        part = part.assign(rank=part.groupby(["model", "task"])["mean"].rank(ascending=False, method="min"))
        part = part.assign(where=part["task"] + " (" + part["model"] + ", " + part["metric"] + ")")
        text = part.apply(lambda r: f"{r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}] n={r['n']}", axis=1)
        cells = part.assign(cell=text)
        wide = cells.pivot_table(index="method", columns="where", values="cell", aggfunc="first")
        stats = part.groupby("method").agg(mean_rank=("rank", "mean"), tasks=("rank", "size"))
        table = stats.join(wide).sort_values(["mean_rank", "tasks"], ascending=[True, False]).reset_index()
        tables[budget] = table
    return tables


def _budget_order(budget: str) -> tuple[int, float]:
    value = float(budget)
    return (0 if value <= 1 else 1, -value)


def render(store: ResultStore, out_dir: str | Path, n_resamples: int = 1000) -> tuple[str, Path, list[str]]:
    """Write ``summary.md`` under ``out_dir``; returns its text, its path and warnings (runs with
    fewer than :data:`~reports.runs.SMALL_N` samples, whose bootstrap intervals are unreliable)."""
    from reports.store import atomic_write_text

    runs = scored_runs(store, n_resamples)
    lines = [
        "# Summary: methods ranked per budget across tasks",
        "",
        f"Store `{store.root}`; {len(runs)} finished quality runs with per-sample scores. Cells: mean "
        f"[{CONFIDENCE:.0%} bootstrap CI over samples]; rank 1 = best within a (model, task, budget); "
        "FullKV (budget none) is ranked in every budget as the reference.",
    ]
    warnings = []
    small = runs[runs["n"] < SMALL_N] if len(runs) else runs
    if len(small):
        warning = (
            f"warning: {len(small)} of {len(runs)} runs have fewer than {SMALL_N} samples "
            f"(smallest n = {int(small['n'].min())}); their bootstrap intervals are unreliable"
        )
        warnings.append(warning)
        lines += ["", f"**{warning.removeprefix('warning: ').capitalize()}.**"]
    for budget, table in ranking(runs).items():
        shown = table.astype(object).where(table.notna(), None)
        lines += [
            "",
            f"## budget {budget}",
            "",
            shown.to_markdown(index=False, floatfmt=".2f", missingval="–"),
        ]
    path = Path(out_dir) / "summary.md"
    text = "\n".join(lines) + "\n"
    atomic_write_text(path, text)
    return text, path, warnings
