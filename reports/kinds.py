"""The four kinds of experiment report (``report.kind`` of ``configs/experiment/<name>.yaml``):
``table``, ``sensitivity``, ``curve`` and ``error``. Each reads a :class:`Context` and returns its
table, figures and extra tables (:data:`KINDS`); ``reports.experiment.build`` writes them.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
from omegaconf import ListConfig, OmegaConf

from reports import figures, style
from reports.cells import (
    ordered,
    paper_cells,
    ratio_table,
    spread_reference,
    wide_table,
    with_paper,
    with_stand_ins,
)
from reports.context import Context
from reports.experiment_paired import HEADING, paired_table
from reports.frame import cell_means, label
from reports.runs import mean_interval, pooled_scores, sample_values

Rendered = tuple[pd.DataFrame, list[style.Plot], list[tuple[str, pd.DataFrame]]]  # table, figures, extras


def scored_cells(ctx: Context, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """Per ``keys`` cell and metric: mean, 95% interval and n over the per-sample scores of the
    cell's distinct finished runs, averaged per sample id so that none counts twice (the record's
    mean and n where a run has no predictions)."""
    done = ctx.frame[ctx.frame["status"] == "ok"].drop_duplicates(["run_id", *keys])
    rows = []
    for cell, group in done.groupby([*keys], sort=False, dropna=False):
        cell = cell if isinstance(cell, tuple) else (cell,)
        for metric in metrics:
            scores = pooled_scores([sample_values(ctx.store, rid, metric) for rid in group["run_id"]])
            if scores:
                (mean, low, high), n = mean_interval(scores, metric), len(scores)
            elif metric in group and group[metric].notna().any():
                mean, low, high, n = float(group[metric].mean()), None, None, group["n_samples"].max()
            else:
                continue
            rows.append(
                {
                    **{k: label(v) for k, v in zip(keys, cell, strict=True)},
                    "metric": metric,
                    "mean": mean,
                    "low": low,
                    "high": high,
                    "n": n,
                }
            )
    return pd.DataFrame(rows, columns=[*keys, "metric", "mean", "low", "high", "n"])


def failed_hues(ctx: Context, hue: str) -> dict[str, str]:
    """Hue values without any compared run: why (``failed (3 of 3 runs)``, ``missing``, ``not
    paired: other samples``)."""
    out = {}
    frame = ctx.frame.drop_duplicates("run_id").assign(_hue=ctx.frame[hue].map(label))
    for value, group in frame.groupby("_hue", sort=False):
        if (group["status"] == "ok").any():
            continue
        failed = group[~group["status"].isin(["missing", "unpaired"])]
        unpaired = group[group["status"] == "unpaired"]
        if len(unpaired):
            out[value] = f"not paired: other samples ({len(unpaired)} of {len(group)} runs)"
            continue
        out[value] = (
            f"failed ({len(failed)} of {len(group)} runs)" if len(failed) else f"missing ({len(group)} runs)"
        )
    return out


def _paper_points(
    ctx: Context, hue: str, x: str, metrics: list[str], facet: str | None = None
) -> pd.DataFrame:
    keys = [x, *([facet] if facet else [])]  # a panel shows the paper's cells of its facet value only
    paper = with_stand_ins(paper_cells(ctx.spec, [hue], keys), ctx.stand_ins)
    if paper.empty:
        return paper
    paper = paper[paper["model"].isin(ctx.models)]
    present = [m for m in metrics if m in paper]
    long = paper.melt(id_vars=[hue, *keys], value_vars=present, var_name="metric", value_name="value")
    long = long.dropna()
    return long.rename(columns={hue: "hue", x: "x", **({facet: "facet"} if facet else {})})


def _table_kind(ctx: Context) -> Rendered:
    frame, spec, index = ctx.frame, ctx.spec, ctx.index
    columns, values = list(spec.get("columns") or []), list(spec["values"])
    table = wide_table(cell_means(frame, [*index, *columns], values), index, columns, values)
    paper = with_stand_ins(paper_cells(spec, index, columns), ctx.stand_ins)
    several = "model" in index and len(ctx.models) > 1
    model = None if several else ctx.models[0]
    ratio_values = _ratio_values(spec)
    ratios = [_ratio_part(ctx, paper, [*index, *columns], model, v) for v in ratio_values]
    plots = []
    if spec.get("figure"):
        fig = spec.figure
        hue = fig.get("hue") or index[0]
        ys = list(fig.y) if isinstance(fig.y, ListConfig) else [fig.y]
        facet = fig.get("facet")
        keys = ordered([hue, fig.x, *([facet] if facet else [])])
        names = {hue: "hue", fig.x: "x", **({facet: "facet"} if facet else {})}
        points, theirs, note = scored_cells(ctx, keys, ys).rename(columns=names), None, None
        if ys[0] in ratio_values:  # the comparable numbers: ratios
            points, theirs, ys, note = _ratio_points(ratios[ratio_values.index(ys[0])], names, ys[0])
        if len(points) or failed_hues(ctx, hue):
            plots.append(
                figures.lines(
                    points,
                    fig.x,
                    ys,
                    ctx.hue(hue),
                    ctx.title,
                    ctx.budget_unit(),
                    _paper_points(ctx, hue, fig.x, ys, facet) if theirs is None else theirs,
                    failed_hues(ctx, hue),
                    bool(fig.get("log_y")),
                    fig.get("facet"),
                    note,
                )
            )
    extra = []
    differences = paired_table(ctx, [*index, *columns], values)
    if differences is not None:
        extra.append((HEADING, differences))
    if spec.get("per_dataset"):  # LongBench: one column per subset the runs scored (record protocol)
        subsets = ordered(
            s
            for r in ctx.records.values()
            if r and r["status"] == "ok"
            for s in (r.get("protocol") or {}).get("subsets", [])
        )
        per = wide_table(cell_means(frame, [*index, *columns], subsets), index, columns, subsets)
        extra.append(("Per dataset", spread_reference(per, index)))
    extra[:0] = ratios
    if len(paper):
        table = with_paper(table, paper, index, columns, values, model)
        if not set(ctx.models) <= set(paper["model"]):
            paper_index = index if "model" in index else ["model", *index]
            ref = spread_reference(wide_table(paper, paper_index, columns, values), paper_index)
            others = ", ".join(m for m in ctx.models if m not in set(paper["model"]))
            extra.append((f"The paper's numbers ({spec.paper.source}; its models, not {others})", ref))
    return spread_reference(table, index), plots, extra


def _ratio_points(
    ratio: tuple[str, pd.DataFrame], names: dict[str, str], value: str
) -> tuple[pd.DataFrame, pd.DataFrame, list[str], str]:
    """The figure of a ``report.ratio`` experiment: each cell's ratio (ours as points, the paper's as
    hollow markers) instead of the raw ``value``, whose scales differ between our model and the
    paper's (a truncated random model beside full depth); ``names`` renames the figure's keys."""
    heading, table = ratio
    metric = f"{style.metric_label(value)}, ratio"
    table = table.rename(columns=names).assign(metric=metric)
    ours = table.dropna(subset=["ratio"]).assign(mean=lambda t: t["ratio"], low=None, high=None, n=None)
    theirs = table.dropna(subset=["paper: ratio"]) if "paper: ratio" in table else table.iloc[:0]
    note = (
        f"Points: each cell's {heading} in the same run grid; hollow markers: the same ratio from "
        "the paper's cells."
    )
    return ours, theirs.assign(value=theirs.get("paper: ratio")), [metric], note


def _ratio_values(spec) -> list[str]:
    """The values ``report.ratio.value`` names (one or a list); none without ``report.ratio``."""
    value = spec.ratio.value if spec.get("ratio") else []
    return [str(v) for v in value] if isinstance(value, ListConfig) else [str(value)] if value else []


def _ratio_part(
    ctx: Context, paper: pd.DataFrame, keys: list[str], model: str | None, value: str
) -> tuple[str, pd.DataFrame]:
    """``report.ratio`` (``{value, reference}``, ``value`` one name or a list): each cell's ``value``
    over its reference cell's, beside the paper's ratio (:func:`reports.cells.ratio_table`), as a
    titled extra table."""
    reference = OmegaConf.to_container(ctx.spec.ratio.reference, resolve=True)
    keys = ordered(keys)
    means = cell_means(ctx.frame, keys, [value])
    table = ratio_table(means, paper, keys, value, reference, model)
    against = ", ".join(f"{k}={v}" for k, v in reference.items())
    table.attrs["caption"] = (
        f"ratio: the cell's {value} over the reference cell's ({against}, every other key the cell's)"
        + (
            "; paper: the same from the paper's cells (the header says what our model is)."
            if "paper: ratio" in table
            else "."
        )
    )
    return f"{value} over the reference ({against})", table


def _sensitivity_kind(ctx: Context) -> Rendered:
    knobs = []
    for job in ctx.jobs:
        vary = OmegaConf.to_container(job.cfg.vary) if job.cfg.get("vary") else {}
        knob, value = next(iter(vary.items())) if vary else ("anchor", None)
        knobs.append((knob, value))
    ctx.frame = ctx.frame.assign(knob=[k for k, _ in knobs], value=[v for _, v in knobs])
    labels = dict(ctx.spec.labels)
    anchors = {}
    for job, (knob, _) in zip(ctx.jobs, knobs, strict=True):
        for other in labels:
            if other != knob and other not in anchors:
                anchors[other] = job.cfg.method.get(other)
    metrics = list(ctx.spec.metrics)
    points = scored_cells(ctx, ["knob", "value"], metrics)
    points = points.assign(value=pd.to_numeric(points["value"], errors="coerce"))
    plots = [figures.sensitivity(points, metrics, labels, anchors, ctx.title)] if len(points) else []
    done = ctx.frame[ctx.frame["status"] == "ok"]
    means = (
        done.groupby(["knob", "value"], sort=False)[[m for m in metrics if m in done]].mean().reset_index()
    )
    return means.assign(knob=means["knob"].map(lambda k: labels.get(k, k))), plots, []


def _curve_kind(ctx: Context) -> Rendered:
    from reports.memory import draw, record_points

    done = ctx.frame[ctx.frame["status"] == "ok"].drop_duplicates("run_id")
    points = pd.DataFrame([p for rid in done["run_id"] for p in record_points(ctx.records[rid])])
    if points.empty:
        return points, [], []
    plots = [draw(points, ctx.title)]
    table = points.pivot_table(
        index="context", columns="series", values=["kv_mib", "memory_mib", "tokens_per_s"]
    )
    table.columns = [f"{v} @ {h}" for v, h in table.columns]
    return table.reset_index(), plots, []


def _error_kind(ctx: Context) -> Rendered:
    hue = ctx.spec.index[0]
    rows = []
    for _, run in ctx.frame[ctx.frame["status"] == "ok"].drop_duplicates("run_id").iterrows():
        analysis = ctx.records[run["run_id"]].get("error_analysis") or {}
        if not analysis.get("budgets"):
            continue
        low, high = figures.layer_range(analysis["per_layer"])
        for i, budget in enumerate(analysis["budgets"]):
            rows.append(
                {
                    "hue": label(run[hue]),
                    "x": label(budget),
                    "metric": "rel_error",
                    "mean": analysis["mean"][i],
                    "low": low[i],
                    "high": high[i],
                    "n": len(analysis["per_layer"][i]),
                }
            )
    points = pd.DataFrame(rows, columns=["hue", "x", "metric", "mean", "low", "high", "n"])
    points = (
        points.groupby(["hue", "x", "metric"], sort=False)
        .agg(mean=("mean", "mean"), low=("low", "min"), high=("high", "max"), n=("n", "min"))
        .reset_index()
    )
    plots = []
    if len(points) or failed_hues(ctx, hue):
        paper = _paper_points(ctx, hue, "budget", ["rel_error"])
        log_y = bool((ctx.spec.get("figure") or {}).get("log_y", True))
        plots.append(
            figures.lines(
                points,
                "budget",
                ["rel_error"],
                ctx.hue(hue),
                ctx.title,
                ctx.budget_unit() or "prompt",
                paper,
                failed_hues(ctx, hue),
                log_y,
                note=ERROR_NOTE,
            )
        )
    means = points.rename(columns={"hue": hue, "x": "budget", "mean": "rel_error"})
    table = wide_table(means, [hue], ["budget"], ["rel_error"])
    paper = paper_cells(ctx.spec, [hue], ["budget"])
    if len(paper) and set(ctx.models) & set(paper["model"]):
        table = with_paper(table, paper, [hue], ["budget"], ["rel_error"], ctx.models[0])
    return table, plots, []


ERROR_NOTE = (
    "Points: mean over layers and decode steps of the relative error of the attention output against FullKV; "
    "shaded: smallest to largest layer; hollow markers: the paper's values."
)

KINDS: dict[str, Callable[[Context], Rendered]] = {
    "table": _table_kind,
    "sensitivity": _sensitivity_kind,
    "curve": _curve_kind,
    "error": _error_kind,
}
