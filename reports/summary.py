"""``python -m reports summary``: methods ranked per budget across every task run so far, with
bootstrap confidence intervals over samples (the papers report none).

For every finished quality run the task's primary metric (the first of the record's metrics) is
re-averaged from the per-sample scores in ``predictions.jsonl`` and resampled (scipy's
percentile bootstrap, 95%). Runs are compared within a (model, task) only on the same samples
(:mod:`reports.pairing`); the others are listed with the reason. Within each (model, task,
budget) methods are ranked by mean (1 = best; FullKV, the only reference, joins every budget of
its model and task); a method that ignores the budget (KVMerger at a fixed theta) is ranked in its
own ``outcome`` group with the fraction it kept; a method's summary rank is its mean rank over the
tasks it ran. Each budget's ranking is followed by each setting's paired difference from FullKV and
from ``--baseline`` (:mod:`reports.summary_paired`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from reports.frame import label
from reports.incomplete import suffix
from reports.paired import RESAMPLES, SEED
from reports.pairing import Pairing, describe, pair_frame
from reports.runs import MIN_N, SMALL_N, Filters, pooled_scores, runs_frame, sample_values
from runners.results.store import ResultStore
from tasks.errors import KVBenchError

CONFIDENCE = 0.95


def interval(scores: list[float], n_resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
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


def scored_runs(store: ResultStore, n_resamples: int = RESAMPLES) -> tuple[pd.DataFrame, Pairing]:
    """One row per (model, task, budget, method label) of finished quality runs with per-sample
    scores, one run per setting (the newest finished) and paired on the same samples within each
    (model, task) (:func:`reports.pairing.pair`): model, task, budget (``outcome`` for a method
    that ignores it, with the fraction ``kept``), method label, ``reference`` (FullKV), metric (the
    first of the record's), n, mean, CI bounds, and the method's registry name, preset, protocol
    tag and run ids. Runs of several seeds are averaged per sample id
    (:func:`reports.runs.pooled_scores`). Returns the rows and the pairing (the runs left out and
    why, the runs on other inputs)."""
    infos = runs_frame(store, Filters(runner="quality"))
    pairing = pair_frame(store, infos)
    infos = infos[infos["run_id"].isin(pairing.kept)]
    infos = infos.assign(
        budget_key=[OUTCOME if r.budget_realised else label(r.budget) for r in infos.itertuples()],
        metric=infos["metrics"].map(lambda ms: next(iter(ms), None)),
    )
    keys = ["model", "task", "budget_key", "budget_unit", "protocol", "label"]
    rows = []
    for (model, task, budget, unit, protocol, method), group in infos.groupby(keys, sort=False, dropna=False):
        metric = group["metric"].iloc[0]
        scores = pooled_scores([sample_values(store, rid, metric, True) for rid in group["run_id"]])
        if metric is None or not scores:
            continue
        low, high = interval(scores, n_resamples)
        kept = group["budget"].iloc[0] if budget == OUTCOME else None
        first = group.iloc[0]
        rows.append({
            "model": model, "task": task, "budget": budget, "budget_unit": unit, "kept": kept,
            "method": method, "reference": bool(first["reference"]),
            "metric": metric, "n": len(scores), "mean": float(np.mean(scores)), "low": low, "high": high,
            "registry": first["method"], "preset": first["preset"], "protocol": protocol,
            "run_ids": " ".join(group["run_id"]),
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame, pairing
    keys = ["model", "task", "budget", "budget_unit", "method"]
    return frame.sort_values(keys).reset_index(drop=True), pairing


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


def render(
    store: ResultStore, out_dir: str | Path, n_resamples: int = RESAMPLES, baseline: str | None = None
) -> tuple[str, Path, list[str]]:
    """Write ``summary.md`` under ``out_dir``; returns its text, its path and warnings (runs with
    fewer than :data:`~reports.runs.SMALL_N` samples, whose bootstrap intervals are unreliable,
    runs left out because they were scored on other samples or are incomplete, runs on other
    inputs). Each budget's ranking is followed by the paired differences from FullKV and ``baseline``
    (:mod:`reports.summary_paired`).

    Raises
    ------
    KVBenchError
        When the store holds no finished quality run with per-sample scores, or ``baseline`` has
        no run on the compared samples (nothing is written).
    """
    from reports import summary_paired
    from runners.results.store import atomic_write_text

    runs, pairing = scored_runs(store, n_resamples)
    if runs.empty:
        raise KVBenchError(
            f"no finished quality runs with per-sample scores under {store.root}/runs"
            + suffix(pairing.incomplete)
        )
    paired = summary_paired.compared(store, runs, baseline, n_resamples)
    deltas = summary_paired.tables(paired)
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
        if budget in deltas:
            table = deltas[budget].to_markdown(index=False, disable_numparse=True)
            lines += ["", f"Paired differences at {heading}:", "", table]
            lines += ["", paired.caption(paired.frame[paired.frame["budget"] == budget], "the metric")]
    lines += ["", "## Compared samples", ""]
    lines += [f"- {', '.join(group)}: {describe(key)}" for group, key in pairing.samples.items()]
    unpaired = pairing.unpaired_notes()
    lines += ["", "## Not paired", ""] + ([f"- {n.removeprefix('note: ')}" for n in unpaired] or ["none"])
    lines += pairing.other_section()
    warnings += pairing.notes()
    path = Path(out_dir) / "summary.md"
    text = "\n".join(lines) + "\n"
    atomic_write_text(path, text)
    return text, path, warnings
