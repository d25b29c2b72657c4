"""``python -m reports <experiment>``: an experiment's table (Markdown, LaTeX) and figure (PNG, PDF).

What to show comes from the experiment file's ``report`` node (``configs/experiment/<name>.yaml``):

``kind``
    ``table`` (``values`` per ``index`` row and ``columns`` key), ``sensitivity`` (one
    hyperparameter at a time, the ``vary`` sweep), ``curve`` (efficiency curves against the
    context) or ``error`` (attention-output error per budget).
``index``, ``columns``, ``values``
    Keys of a row (config groups by their chosen option, other keys from the stored config,
    e.g. ``budget``, ``runner.batch``) and record metrics; a cell is the mean over its runs.
``figure``
    ``{x, y, hue, facet}`` for a line plot of the cell means (``table`` kind).
``paper``
    ``{source, cells}``: the paper's numbers; shown in columns next to ours when the model is the
    same, otherwise as a separate reference table (the paper's model, not ours).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, ListConfig, OmegaConf

from reports import figures, style, tables
from reports.frame import cell_means, job_frame, label, near_misses, not_done, report_jobs
from reports.runs import budget_axis, mean_interval, sample_scores
from runners.results import ResultStore, atomic_write_text


@dataclass
class Report:
    """A rendered report: Markdown text, the main table, the files written and the figures drawn
    (:class:`~reports.style.Plot`, their matplotlib figures closed but readable)."""

    markdown: str
    table: pd.DataFrame
    files: list[Path] = field(default_factory=list)
    plots: list[style.Plot] = field(default_factory=list)


def _ordered(values) -> list:
    return list(dict.fromkeys(values))


def wide_table(means: pd.DataFrame, index: list[str], columns: list[str], values: list[str]) -> pd.DataFrame:
    """Cell means as a table: one row per ``index`` tuple and, per ``columns`` tuple (a budget),
    a group of one column per value (``"rouge1 @ 0.2"``), in the order the sweep lists them."""
    present = [v for v in values if v in means.columns]
    row_keys = _ordered(map(tuple, means[index].itertuples(index=False))) if len(means) else []
    col_keys = _ordered(map(tuple, means[columns].itertuples(index=False))) if columns else [()]
    lookup = {tuple(r[[*index, *columns]]): r for _, r in means.iterrows()}
    table: dict[str, list] = {k: [r[i] for r in row_keys] for i, k in enumerate(index)}
    for col in col_keys:
        for metric in present:
            header = metric if not col else f"{metric} @ {'/'.join(col)}"
            cells = [lookup.get(row + col) for row in row_keys]
            table[header] = [None if c is None else c[metric] for c in cells]
    frame = pd.DataFrame(table)
    empty = [c for c in frame.columns if c not in index and frame[c].isna().all()]
    return frame.drop(columns=empty)


def spread_reference(table: pd.DataFrame, index: list[str]) -> pd.DataFrame:
    """Rows that have numbers only in ``@ none`` columns (FullKV: no budget) get them in every
    budget group, and the ``@ none`` columns go: FullKV is a reference row, not its own group."""
    none_cols = [c for c in table.columns if c not in index and str(c).endswith(" @ none")]
    if not none_cols or len(none_cols) == len([c for c in table.columns if c not in index]):
        return table
    out = table.copy()
    others = [c for c in table.columns if c not in index and c not in none_cols]
    groups = _ordered(c.rsplit(" @ ", 1)[1] for c in others if " @ " in c)
    reference = out[none_cols].notna().any(axis=1) & out[others].isna().all(axis=1)
    for col in none_cols:
        stem = col.removesuffix(" @ none")
        for group in groups:
            target = f"{stem} @ {group}"
            if target in out:
                out.loc[reference, target] = out.loc[reference, col]
    kept = out.drop(columns=none_cols)
    order = pd.concat([kept[reference], kept[~reference]])
    return order.reset_index(drop=True)


def paper_cells(spec: DictConfig, index: list[str], columns: list[str]) -> pd.DataFrame:
    """The paper's numbers (``report.paper.cells``) as cell means, keys as :func:`frame.label`."""
    cells = OmegaConf.to_container(spec.paper.cells, resolve=True) if spec.get("paper") else []
    frame = pd.DataFrame(cells)
    for key in ["model", *index, *columns]:
        if key not in frame:
            frame[key] = None
        frame[key] = frame[key].map(label)
    return frame


def with_paper(
    ours: pd.DataFrame,
    paper: pd.DataFrame,
    index: list[str],
    columns: list[str],
    values: list[str],
    model: str | None,
) -> pd.DataFrame:
    """``ours`` with a ``paper: <column>`` column after each of our columns the paper has numbers
    for, on rows of the same model and setting. ``paper`` holds the paper's cells
    (:func:`paper_cells`); ``index`` includes ``model`` when a table has several models, otherwise
    ``model`` names the one model of ours."""
    same = paper if model is None else paper[paper["model"] == model]
    if same.empty:
        return ours
    theirs_wide = wide_table(same, index, columns, values)
    out = ours.copy()
    for col in [c for c in ours.columns if c not in index]:
        if col not in theirs_wide:
            continue
        theirs = ours[index].merge(theirs_wide[[*index, col]], on=index, how="left")[col]
        if theirs.notna().any():
            out.insert(out.columns.get_loc(col) + 1, f"paper: {col}", theirs.to_numpy())
    return out


def _markdown(frame: pd.DataFrame) -> str:
    if not len(frame):
        return "(no rows)"
    return tables.display(frame).to_markdown(index=False)


def display_keys(table: pd.DataFrame, hue: figures.Hue) -> pd.DataFrame:
    """The table with its hue column by display name (``ZSMerge (xsum_paper)``, ``eviction``)."""
    if hue.key not in table:
        return table
    return table.assign(**{hue.key: table[hue.key].map(hue.label)})


@dataclass
class Context:
    """What every report kind reads: the job frame, the spec, the jobs, their records (by run id),
    the table's index keys, the store, the figure title and the models of our runs."""

    frame: pd.DataFrame
    spec: DictConfig
    jobs: list
    records: dict[str, dict | None]
    index: list[str]
    store: ResultStore
    title: str
    models: list[str]

    def hue(self, key: str) -> figures.Hue:
        """The hue of ``key`` with the spec's ``legend`` names and title."""
        legend = self.spec.get("legend") or {}
        names = {str(k): str(v) for k, v in (legend.get("names") or {}).items()}
        return figures.Hue(key, names, legend.get("title"))

    def budget_unit(self) -> str | None:
        """What the sweep's budgets count (``prompt``/``context`` fractions or ``slots``)."""
        units = {budget_axis(job.cfg.get("budget"), job.cfg.get("budget_unit")) for job in self.jobs} - {None}
        return next(iter(units)) if len(units) == 1 else None


Rendered = tuple[pd.DataFrame, list[style.Plot], list[tuple[str, pd.DataFrame]]]  # table, figures, extras


def scored_cells(ctx: Context, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """Per ``keys`` cell and metric: mean, 95% interval and n over the per-sample scores of the
    cell's distinct finished runs (the record's mean and n where a run has no predictions)."""
    done = ctx.frame[ctx.frame["status"] == "ok"].drop_duplicates(["run_id", *keys])
    rows = []
    for cell, group in done.groupby([*keys], sort=False, dropna=False):
        cell = cell if isinstance(cell, tuple) else (cell,)
        for metric in metrics:
            scores = [v for rid in group["run_id"] for v in sample_scores(ctx.store, rid, metric)]
            if scores:
                (mean, low, high), n = mean_interval(scores), len(scores)
            elif metric in group and group[metric].notna().any():
                mean, low, high, n = float(group[metric].mean()), None, None, group["n_samples"].sum()
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
    """Hue values without any finished run: why (``failed: 3 of 3 runs``, ``missing``)."""
    out = {}
    frame = ctx.frame.drop_duplicates("run_id").assign(_hue=ctx.frame[hue].map(label))
    for value, group in frame.groupby("_hue", sort=False):
        if (group["status"] == "ok").any():
            continue
        failed = group[group["status"] != "missing"]
        out[value] = (
            f"failed ({len(failed)} of {len(group)} runs)" if len(failed) else f"missing ({len(group)} runs)"
        )
    return out


def _paper_points(ctx: Context, hue: str, x: str, metrics: list[str]) -> pd.DataFrame:
    paper = paper_cells(ctx.spec, [hue], [x])
    if paper.empty:
        return paper
    paper = paper[paper["model"].isin(ctx.models)]
    present = [m for m in metrics if m in paper]
    long = paper.melt(id_vars=[hue, x], value_vars=present, var_name="metric", value_name="value").dropna()
    return long.rename(columns={hue: "hue", x: "x"})


def _table_kind(ctx: Context) -> Rendered:
    frame, spec, index = ctx.frame, ctx.spec, ctx.index
    columns, values = list(spec.get("columns") or []), list(spec["values"])
    table = wide_table(cell_means(frame, [*index, *columns], values), index, columns, values)
    plots = []
    if spec.get("figure"):
        fig = spec.figure
        hue = fig.get("hue") or index[0]
        ys = list(fig.y) if isinstance(fig.y, ListConfig) else [fig.y]
        facet = fig.get("facet")
        keys = _ordered([hue, fig.x, *([facet] if facet else [])])
        points = scored_cells(ctx, keys, ys).rename(
            columns={hue: "hue", fig.x: "x", **({facet: "facet"} if facet else {})}
        )
        if len(points) or failed_hues(ctx, hue):
            plots.append(
                figures.lines(
                    points,
                    fig.x,
                    ys,
                    ctx.hue(hue),
                    ctx.title,
                    ctx.budget_unit(),
                    _paper_points(ctx, hue, fig.x, ys),
                    failed_hues(ctx, hue),
                    bool(fig.get("log_y")),
                    fig.get("facet"),
                )
            )
    extra = []
    if spec.get("per_dataset"):  # LongBench: one column per subset the runs scored (record protocol)
        subsets = _ordered(
            s
            for r in ctx.records.values()
            if r and r["status"] == "ok"
            for s in (r.get("protocol") or {}).get("subsets", [])
        )
        per = wide_table(cell_means(frame, [*index, *columns], subsets), index, columns, subsets)
        extra.append(("Per dataset", spread_reference(per, index)))
    paper = paper_cells(spec, index, columns)
    if len(paper):
        several = "model" in index and len(ctx.models) > 1
        table = with_paper(table, paper, index, columns, values, None if several else ctx.models[0])
        if not set(ctx.models) <= set(paper["model"]):
            paper_index = index if "model" in index else ["model", *index]
            ref = spread_reference(wide_table(paper, paper_index, columns, values), paper_index)
            others = ", ".join(m for m in ctx.models if m not in set(paper["model"]))
            extra.append((f"The paper's numbers ({spec.paper.source}; its models, not {others})", ref))
    return spread_reference(table, index), plots, extra


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


def build(
    experiment: str, scale: str, results_dir: str | Path, out_dir: str | Path, overrides: Sequence[str] = ()
) -> Report:
    """Render ``experiment`` at ``scale`` from the store under ``results_dir`` into ``out_dir``
    (``<experiment>_<scale>.md``/``.tex``, and ``.png``/``.pdf``/``.csv`` when it has a figure).

    ``overrides`` are the extra command-line overrides the sweep ran with (``seed=0,1,2``: each
    cell then averages the seeds).

    Raises
    ------
    KVBenchError
        For an unknown experiment.
    """
    store = ResultStore(results_dir)
    base, jobs, records = report_jobs(experiment, scale, overrides, store)
    spec = base.report
    several_models = len({job.cfg.model.name for job in jobs}) > 1
    index = list(spec.get("index", []))
    if several_models and "model" not in index:
        index = ["model", *index]
    keys = _ordered([*index, *(spec.get("columns") or []), "model"])
    frame = job_frame(jobs, records, keys)
    stem = Path(out_dir) / f"{experiment}_{scale}"
    models = _ordered(frame["model"].map(str))
    title = f"{spec.title} ({scale}: {', '.join(models)})"
    ctx = Context(frame, spec, jobs, records, index, store, title, models)
    table, plots, extra = KINDS[spec.kind](ctx)
    distinct = frame.drop_duplicates("run_id")
    finished = int((distinct["status"] == "ok").sum())
    hue = ctx.hue(index[0]) if index else figures.Hue("")
    lines = [
        f"# {title}",
        "",
        f"Ours: model **{', '.join(models)}**, scale `{scale}`; {finished} of {len(distinct)} distinct runs "
        f"finished ({len(jobs)} sweep jobs); store `{store.root}`. Each cell: the mean over its finished runs"
        + (
            "; FullKV (no budget) is the reference row, repeated under every budget."
            if spec.kind == "table"
            else "."
        ),
        "",
        _markdown(display_keys(table, hue)),
    ]
    for heading, part in extra:
        lines += ["", f"## {heading}", "", _markdown(display_keys(part, hue))]
    missing = not_done(frame)
    lines += ["", "## Missing or failed runs", ""]
    lines.append(_markdown(missing) if len(missing) else "none")
    if finished < len(distinct):
        lines += _near_miss_lines(experiment, scale, overrides, near_misses(jobs, records, store))
    files = []
    for plot in plots:
        plot.stem = stem.name
        files += plot.save(stem.parent)
    if files:
        lines += ["", "Figure: " + ", ".join(f"`{p.name}`" for p in files)]
    text = "\n".join(lines) + "\n"
    atomic_write_text(stem.with_suffix(".md"), text)
    tex = tables.latex(tables.display(display_keys(table, hue)), title, f"tab:{experiment}")
    for heading, part in extra:
        tex += "\n" + tables.latex(tables.display(display_keys(part, hue)), f"{title}: {heading}")
    atomic_write_text(stem.with_suffix(".tex"), tex)
    return Report(text, table, [stem.with_suffix(".md"), stem.with_suffix(".tex"), *files], plots)


def _near_miss_lines(
    experiment: str, scale: str, overrides: Sequence[str], misses: dict[str, int]
) -> list[str]:
    if not misses:
        return []
    lines = ["", "## Stored runs that differ only by overrides", ""]
    for text, count in misses.items():
        command = " ".join(["python -m reports", experiment, "--scale", scale, *overrides, text])
        lines.append(
            f"- {count} missing job(s) have a finished run with `{text}`: include them with `{command}`"
        )
    return lines
