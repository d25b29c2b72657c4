"""``python -m reports summary``: methods ranked per budget across every task run so far, with
bootstrap confidence intervals over samples (the papers report none).

For every finished quality run the task's primary metric (the first of the record's metrics) is
re-averaged from the per-sample scores in ``predictions.jsonl`` and resampled (scipy's
percentile bootstrap, 95%). Runs are compared within a (model, task) only on the same samples
(:mod:`reports.pairing`); the others are listed with the reason. Within each (model, task,
budget) methods are ranked by mean (1 = best; FullKV, the only reference, joins every budget of
its model and task); a method that ignores the budget (KVMerger at a fixed theta) is ranked in its
own ``outcome`` group with the fraction it kept; a method's summary rank is its mean rank over the
tasks it ran.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from reports.frame import label
from reports.pairing import Pairing, describe, pair_frame
from reports.runs import MIN_N, SMALL_N, row, row_columns
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
    """Percentile-bootstrap 95% confidence interval of the mean (within the scores' range; NaN for
    fewer than :data:`~reports.runs.MIN_N` samples)."""
    if len(scores) < MIN_N:
        return math.nan, math.nan
    if len(set(scores)) == 1:
        return scores[0], scores[0]
    res = bootstrap(
        (np.asarray(scores),), np.mean, n_resamples=n_resamples, confidence_level=CONFIDENCE,
        method="percentile", rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


#: The budget group of runs whose budget is an outcome (KVMerger at a fixed theta).
OUTCOME = "outcome"


def scored_runs(store: ResultStore, n_resamples: int = 1000) -> tuple[pd.DataFrame, Pairing]:
    """One row per finished quality run with per-sample scores, paired on the same samples within
    each (model, task) (:func:`reports.pairing.pair`): model, task, budget (``outcome`` for a
    method that ignores it, with the fraction ``kept``), method label, ``reference`` (FullKV),
    metric, n, mean, CI bounds. Of several paired runs with the same (model, task, budget, label)
    the last is kept. Returns the rows and the pairing (the runs left out and why)."""
    records = [
        r
        for r in store.records()
        if r.get("status") == "ok" and ((r.get("config") or {}).get("runner") or {}).get("name") == "quality"
    ]
    infos = pd.DataFrame([row(r) for r in records], columns=row_columns())
    pairing = pair_frame(store, infos)
    rows = []
    for rec, info in zip(records, infos.itertuples(), strict=True):
        if info.run_id not in pairing.kept:
            continue
        metric, scores = sample_scores(store, rec)
        if not scores:
            continue
        low, high = interval(scores, n_resamples)
        rows.append({
            "model": info.model, "task": info.task,
            "budget": OUTCOME if info.budget_realised else label(info.budget),
            "budget_unit": info.budget_unit, "kept": info.budget if info.budget_realised else None,
            "method": info.label, "reference": info.reference,
            "metric": metric, "n": len(scores), "mean": float(np.mean(scores)), "low": low, "high": high,
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame, pairing
    keys = ["model", "task", "budget", "budget_unit", "method"]
    return frame.drop_duplicates(keys, keep="last").sort_values(keys).reset_index(drop=True), pairing


def _cell(r: pd.Series) -> str:
    text = (
        f"{r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" if r["low"] == r["low"] else f"{r['mean']:.2f}"
    )
    kept = (
        f", kept {100 * r['kept']:.0f}%"
        if r.get("kept") == r.get("kept") and r.get("kept") is not None
        else ""
    )
    return f"{text} n={r['n']}{kept}"


def ranking(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per budget (and the ``outcome`` group), methods by mean rank over tasks; FullKV, the only
    reference, joins every group of its (model, task); cells ``mean [low, high] n`` per (task,
    model)."""
    if runs.empty:
        return {}
    reference = runs[runs["reference"]]
    reference = reference.assign(method=reference["method"] + " (reference)")
    compressed = runs[~runs["reference"]]
    tables = {}
    for budget in sorted(set(compressed["budget"]), key=_budget_order):
        here = compressed[compressed["budget"] == budget]
        part = pd.concat([here, reference])
        part = part[part.set_index(["model", "task"]).index.isin(here.set_index(["model", "task"]).index)]
        part = part.assign(rank=part.groupby(["model", "task"])["mean"].rank(ascending=False, method="min"))
        part = part.assign(where=part["task"] + " (" + part["model"] + ", " + part["metric"] + ")")
        cells = part.assign(cell=part.apply(_cell, axis=1))
        wide = cells.pivot_table(index="method", columns="where", values="cell", aggfunc="first")
        stats = part.groupby("method").agg(mean_rank=("rank", "mean"), tasks=("rank", "size"))
        table = stats.join(wide).sort_values(["mean_rank", "tasks"], ascending=[True, False]).reset_index()
        tables[budget] = table
    return tables


def _budget_order(budget: str) -> tuple[int, float]:
    """Fractions (largest first), then slot counts, then ``outcome``, then anything else."""
    try:
        value = float(budget)
    except ValueError:
        return (2 if budget == OUTCOME else 3, 0.0)
    return (0 if value <= 1 else 1, -value)


def render(store: ResultStore, out_dir: str | Path, n_resamples: int = 1000) -> tuple[str, Path, list[str]]:
    """Write ``summary.md`` under ``out_dir``; returns its text, its path and warnings (runs with
    fewer than :data:`~reports.runs.SMALL_N` samples, whose bootstrap intervals are unreliable,
    and runs left out because they were scored on other samples)."""
    from reports.store import atomic_write_text

    runs, pairing = scored_runs(store, n_resamples)
    lines = [
        "# Summary: methods ranked per budget across tasks",
        "",
        f"Store `{store.root}`; {len(runs)} finished quality runs with per-sample scores, compared "
        f"within a (model, task) only on the same samples. Cells: mean [{CONFIDENCE:.0%} bootstrap CI "
        f"over samples; none below n = {MIN_N}]; rank 1 = best within a (model, task, budget); "
        "FullKV, the reference, is ranked in every budget of its model and task. Methods that "
        "ignore the budget (KVMerger at a fixed theta) are ranked under `outcome`, with the "
        "fraction of the prompt they kept.",
    ]
    warnings = []
    small = runs[runs["n"] < SMALL_N] if len(runs) else runs
    if len(small):
        warning = (
            f"warning: {len(small)} of {len(runs)} runs have fewer than {SMALL_N} samples "
            f"(smallest n = {int(small['n'].min())}); their bootstrap intervals are unreliable"
            + (f" or absent (n < {MIN_N})" if int(small["n"].min()) < MIN_N else "")
        )
        warnings.append(warning)
        lines += ["", f"**{warning.removeprefix('warning: ').capitalize()}.**"]
    for budget, table in ranking(runs).items():
        shown = table.astype(object).where(table.notna(), None)
        heading = (
            "budget as an outcome (kept fraction of the prompt)" if budget == OUTCOME else f"budget {budget}"
        )
        lines += ["", f"## {heading}", "", shown.to_markdown(index=False, floatfmt=".2f", missingval="–")]
    lines += ["", "## Compared samples", ""]
    lines += [f"- {', '.join(group)}: {describe(key)}" for group, key in pairing.samples.items()]
    notes = pairing.notes()
    lines += ["", "## Not paired", ""] + ([f"- {n.removeprefix('note: ')}" for n in notes] or ["none"])
    warnings += notes
    path = Path(out_dir) / "summary.md"
    text = "\n".join(lines) + "\n"
    atomic_write_text(path, text)
    return text, path, warnings
