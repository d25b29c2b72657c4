"""``python -m reports budget``: quality against the KV budget from whatever runs the store holds.

One line per method preset (its display label, colour per method), a 95% confidence band from the
per-sample scores (clipped to the metric's range, none below ``MIN_N`` samples), FullKV (no
budget) as a dashed horizontal reference with its own band, n in the legend; runs are paired on
the same samples (:mod:`reports.pairing`). A method whose budget is an outcome (KVMerger at a
fixed theta) is a point at the fraction of the prompt it kept, never a reference. One panel per
(model, budget unit): fractions of the prompt, fractions of the context window and absolute slot
counts never share an axis.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from reports import style
from reports.incomplete import attached, suffix
from reports.lines import draw_lines, draw_reference, method_legend
from reports.paired import RESAMPLES
from reports.pairing import Pairing, pair_frame
from reports.persample import setting_scores, stratum
from reports.runs import (
    MIN_N,
    SMALL_N,
    Filters,
    mean_interval,
    pooled_scores,
    primary_metric,
    runs_frame,
    sample_values,
)
from reports.versus import differences
from runners.results.store import ResultStore
from tasks.errors import KVBenchError


def quality_points(
    store: ResultStore, filters: Filters, metric: str | None = None
) -> tuple[pd.DataFrame, str, Pairing]:
    """One row per (model, label, budget) of finished quality runs paired on the same samples
    (:func:`reports.pairing.pair`), one run per setting (the newest finished): n, mean and 95%
    interval of ``metric`` over the per-sample scores (the runs of several seeds averaged per
    sample: n counts distinct samples), with the run ids. Returns the frame, the metric and
    the pairing (the runs left out and why).

    Raises
    ------
    KVBenchError
        When no finished quality run passes the filters, when they span several tasks (choose one
        with ``--task``), or when ``metric`` is not among the runs' metrics.
    """
    runs = runs_frame(store, Filters(**{**vars(filters), "runner": filters.runner or "quality"}))
    if runs.empty:
        raise KVBenchError(
            f"no finished quality runs under {store.root}/runs match {_describe(filters)}"
            + suffix(attached(runs))
        )
    tasks = sorted(set(runs["task"]))
    if len(tasks) > 1:
        raise KVBenchError(f"the runs span several tasks ({', '.join(tasks)}); choose one with --task")
    metric = metric or primary_metric(runs)
    known = sorted({m for ms in runs["metrics"] for m in ms})
    if metric not in known:
        raise KVBenchError(
            f"metric {metric!r} is not recorded for task {tasks[0]} (known: {', '.join(known)})"
        )
    pairing = pair_frame(store, runs)
    runs = runs[runs["run_id"].isin(pairing.kept)]
    runs = runs.assign(budget_key=runs["budget"].map(lambda b: "none" if b is None or b != b else repr(b)))
    rows = []
    for (model, label, _), group in runs.groupby(["model", "label", "budget_key"], sort=False):
        scores = pooled_scores([sample_values(store, rid, metric) for rid in group["run_id"]])
        if not scores:  # a run without predictions: its recorded mean, no interval
            scores_mean = float(pd.Series([m.get(metric) for m in group["metrics"]]).mean())
            n = int(group["n"].max())  # paired runs: the same samples
            mean, low, high = scores_mean, float("nan"), float("nan")
        else:
            (mean, low, high), n = mean_interval(scores, metric), len(scores)
        first = group.iloc[0]
        rows.append(
            {
                "model": model,
                "task": first["task"],
                "method": first["method"],
                "preset": first["preset"],
                "label": label,
                "budget": first["budget"],
                "budget_unit": first["budget_unit"],
                "budget_realised": bool(first["budget_realised"]),
                "reference": bool(first["reference"]),
                "quant": first["quant"],
                "protocol": first["protocol"],
                "metric": metric,
                "n": n,
                "mean": mean,
                "ci_low": low,
                "ci_high": high,
                "runs": len(group),
                "kv_mib": group["kv_bytes"].astype(float).mean() / 2**20,
                "peak_mib": group["peak_bytes"].astype(float).mean() / 2**20,
                "peak_kind": first["peak_kind"],
                "run_ids": " ".join(group["run_id"]),
                "other_inputs": " ".join(o for o in group["other_inputs"] if o),
            }
        )
    return pd.DataFrame(rows), metric, pairing


def interval_note(points: pd.DataFrame, what: str = "95% t-interval of the mean") -> tuple[str, list[str]]:
    """The caption sentence and console warnings about small samples: below
    :data:`~reports.runs.MIN_N` no interval is drawn, below :data:`~reports.runs.SMALL_N` it is
    unreliable; intervals are clipped to the metric's range."""
    smallest = int(points["n"].min())
    if smallest < MIN_N:
        text = f"No interval where n < {MIN_N} samples (smallest n = {smallest})."
        return text, [f"warning: n < {MIN_N} samples for some points (n = {smallest}); no interval drawn"]
    if smallest < SMALL_N:
        text = f"Some points have n < {SMALL_N} samples: intervals are wide and unreliable."
        return text, [f"warning: n < {SMALL_N} samples for some points; confidence intervals are unreliable"]
    return "", []


def _describe(filters: Filters) -> str:
    given = {k: v for k, v in vars(filters).items() if v}
    return "the filters " + ", ".join(f"{k}={v}" for k, v in given.items()) if given else "(no filters)"


def draw(
    points: pd.DataFrame, metric: str, title: str | None = None, pairing: Pairing | None = None
) -> style.Plot:
    """The quality-vs-budget figure of :func:`quality_points` rows (one panel per model and unit).

    FullKV is the dashed reference; a run whose budget is an outcome (``budget_realised``) is a
    hollow diamond at the fraction of the prompt it kept; the runs ``pairing`` left out are named in
    the caption and the notes."""
    reference = points[points["reference"]]
    compressed = points[~points["reference"] & points["budget_unit"].notna()]
    unplaced = points[~points["reference"] & points["budget_unit"].isna()]
    panels = list(dict.fromkeys(zip(compressed["model"], compressed["budget_unit"], strict=True)))
    if not panels:
        panels = [(m, None) for m in dict.fromkeys(reference["model"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 2.0, 4.2), squeeze=False)
    markers: list[str] = []
    for ax, (model, unit) in zip(axes[0], panels, strict=True):
        part = compressed[(compressed["model"] == model) & (compressed["budget_unit"] == unit)]
        markers.append(draw_lines(ax, part))
        for _, ref in reference[reference["model"] == model].iterrows():
            draw_reference(ax, ref, ref["mean"])
            if ref["ci_low"] == ref["ci_low"]:
                ax.axhspan(ref["ci_low"], ref["ci_high"], color=style.method_color(ref["method"]), alpha=0.08)
        if unit in ("prompt", "context") and len(part):
            style.percent_axis(ax, part["budget"])
        ax.set_xlabel(
            style.budget_label(unit).replace("fraction", "%") if unit != "slots" else style.budget_label(unit)
        )
        ax.set_ylabel(style.metric_label(metric))
        ax.set_title(f"{model}", fontsize=9)
        ax.grid(alpha=0.3)
        method_legend(ax, dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True)))
        ax.set_ylim(*style.clipped_limits(ax.get_ylim(), metric))
        if (points["mean"] >= 0).all():
            ax.set_ylim(bottom=0)
    task = points["task"].iloc[0]
    style.title(fig, title or f"{task}: {style.metric_label(metric)} vs KV cache budget")
    small, notes = interval_note(points)
    note = (
        "Lines: mean over samples; shaded: 95% t-interval of the mean from per-sample scores, clipped to "
        "the metric's range; dashed: FullKV. Methods are drawn a few points apart sideways so that "
        f"equal values stay visible. {small}"
    )
    note = " ".join([note.strip(), *dict.fromkeys(m for m in markers if m)])
    if points["budget_realised"].any():
        note += (
            " Hollow diamonds: methods whose budget is an outcome, at the fraction of the prompt they kept."
        )
    notes += [
        f"note: {r['label']} (run {r['run_ids'][:8]}) has no budget: not drawn"
        for _, r in unplaced.iterrows()
    ]
    if pairing is not None:
        note += " " + pairing.caption()
        notes += pairing.notes()
    style.caption(fig, note.strip())
    stem = f"budget_{task}_{metric}".replace("/", "-")
    return style.Plot(fig, points, stem, notes)


def build(
    store: ResultStore,
    filters: Filters,
    metric: str | None = None,
    baseline: str | None = None,
    n_resamples: int = RESAMPLES,
) -> list[style.Plot]:
    """The ``budget`` report: one :class:`~reports.style.Plot` (see :func:`draw`) whose CSV and
    Markdown hold each compressed setting's paired difference from FullKV and ``baseline`` at the
    same budget (:func:`reports.versus.differences`).

    Raises
    ------
    KVBenchError
        See :func:`quality_points`; and when ``baseline`` has no run on the compared samples.
    """
    points, metric, pairing = quality_points(store, filters, metric)
    task = str(points["task"].iloc[0])
    scores = setting_scores(store, points["run_ids"], task, metric)
    level = ["budget", "budget_unit", "protocol"]
    found = differences(points, scores, ["model"], level, baseline, n_resamples, stratum(task, metric))
    plot = draw(found.frame, metric, pairing=pairing)
    keys = {"model": "model", "label": "method", "budget": "budget", "budget_unit": "unit"}
    rows = found.frame.sort_values(["model", "label", "budget"], kind="stable")
    plot.text = f"# {task}: paired differences in {metric}\n\n{found.markdown(keys, metric, rows)}\n"
    return [plot]
