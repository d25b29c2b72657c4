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
from omegaconf import DictConfig, OmegaConf

from reports import figures
from reports.frame import cell_means, job_frame, label, not_done, read_records
from runners.results import ResultStore, atomic_write_text
from runners.sweeps import sweep_jobs


@dataclass
class Report:
    """A rendered report: Markdown text, the main table, and the files written."""

    markdown: str
    table: pd.DataFrame
    files: list[Path] = field(default_factory=list)


def _ordered(values) -> list:
    return list(dict.fromkeys(values))


def wide_table(means: pd.DataFrame, index: list[str], columns: list[str], values: list[str]) -> pd.DataFrame:
    """Cell means as a table: one row per ``index`` tuple, one column per value and ``columns``
    tuple (``"rouge1 @ 0.2"``), in the order the sweep lists them."""
    present = [v for v in values if v in means.columns]
    row_keys = _ordered(map(tuple, means[index].itertuples(index=False))) if len(means) else []
    col_keys = _ordered(map(tuple, means[columns].itertuples(index=False))) if columns else [()]
    lookup = {tuple(r[[*index, *columns]]): r for _, r in means.iterrows()}
    table: dict[str, list] = {k: [r[i] for r in row_keys] for i, k in enumerate(index)}
    for metric in present:
        for col in col_keys:
            header = metric if not col else f"{metric} @ {'/'.join(col)}"
            cells = [lookup.get(row + col) for row in row_keys]
            table[header] = [None if c is None else c[metric] for c in cells]
    frame = pd.DataFrame(table)
    empty = [c for c in frame.columns if c not in index and frame[c].isna().all()]
    return frame.drop(columns=empty)


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
    shown = frame.astype(object).where(frame.notna(), None)
    return shown.to_markdown(index=False, floatfmt=".2f", missingval="–")


def _latex(frame: pd.DataFrame, caption: str) -> str:
    return frame.to_latex(index=False, float_format="%.2f", na_rep="--", caption=caption, escape=True)


@dataclass
class Context:
    """What every report kind reads: the job frame, the spec, the jobs, their records (by run id),
    the table's index keys, the output stem and the figure title."""

    frame: pd.DataFrame
    spec: DictConfig
    jobs: list
    records: dict[str, dict | None]
    index: list[str]
    stem: Path
    title: str


Rendered = tuple[pd.DataFrame, list[Path], list[tuple[str, pd.DataFrame]]]  # table, figures, extra tables


def _table_kind(ctx: Context) -> Rendered:
    frame, spec, index = ctx.frame, ctx.spec, ctx.index
    columns, values = list(spec.get("columns") or []), list(spec["values"])
    table = wide_table(cell_means(frame, [*index, *columns], values), index, columns, values)
    files = []
    if spec.get("figure"):
        fig = spec.figure
        hue = fig.get("hue") or index[0]
        keys = _ordered([hue, fig.x, *([fig.facet] if fig.get("facet") else [])])
        fig_means = cell_means(frame, keys, [fig.y])
        if len(fig_means):
            files += figures.lines(fig_means, fig.x, fig.y, hue, fig.get("facet"), ctx.title, ctx.stem)
    extra = []
    if spec.get("per_dataset"):  # LongBench: one column per subset the runs scored (record protocol)
        subsets = _ordered(
            s
            for r in ctx.records.values()
            if r and r["status"] == "ok"
            for s in (r.get("protocol") or {}).get("subsets", [])
        )
        per = wide_table(cell_means(frame, [*index, *columns], subsets), index, columns, subsets)
        extra.append(("Per dataset", per))
    paper = paper_cells(spec, index, columns)
    if len(paper):
        ours_models = _ordered(frame["model"])
        several = "model" in index and len(ours_models) > 1
        table = with_paper(table, paper, index, columns, values, None if several else ours_models[0])
        if not set(ours_models) <= set(paper["model"]):
            paper_index = index if "model" in index else ["model", *index]
            ref = wide_table(paper, paper_index, columns, values)
            others = ", ".join(m for m in ours_models if m not in set(paper["model"]))
            extra.append((f"The paper's numbers ({spec.paper.source}; its models, not {others})", ref))
    return table, files, extra


def _sensitivity_kind(ctx: Context) -> Rendered:
    knobs = []
    for job in ctx.jobs:
        vary = OmegaConf.to_container(job.cfg.vary) if job.cfg.get("vary") else {}
        knob, value = next(iter(vary.items())) if vary else ("anchor", None)
        knobs.append((knob, value))
    frame = ctx.frame.assign(knob=[k for k, _ in knobs], value=[v for _, v in knobs])
    metrics = list(ctx.spec.metrics)
    done = frame[frame["status"] == "ok"]
    present = [m for m in metrics if m in done]
    means = done.groupby(["knob", "value"], sort=False)[present].mean().reset_index()
    labels = dict(ctx.spec.labels)
    files = figures.sensitivity(means, metrics, labels, ctx.title, ctx.stem) if len(means) else []
    return means.assign(knob=means["knob"].map(lambda k: labels.get(k, k))), files, []


def _curve_kind(ctx: Context) -> Rendered:
    hue = ctx.spec.index[0]
    points = []
    for job, (_, row) in zip(ctx.jobs, ctx.frame.iterrows(), strict=True):
        record = ctx.records[job.run_id] if row["status"] == "ok" else None
        for p in (record or {}).get("curve") or []:
            points.append({hue: row[hue], **p, "memory_mib": (p.get("memory_bytes") or 0) / 2**20})
    points = pd.DataFrame(points).drop_duplicates() if points else pd.DataFrame()
    if points.empty:
        return points, [], []
    files = figures.curves(points, hue, ctx.title, ctx.stem)
    table = points.pivot_table(index="context", columns=hue, values=["tokens_per_s", "memory_mib"])
    table.columns = [f"{v} @ {h}" for v, h in table.columns]
    return table.reset_index(), files, []


def _error_kind(ctx: Context) -> Rendered:
    hue = ctx.spec.index[0]
    frame = ctx.frame
    cols = [c for c in frame.columns if c.startswith("rel_error@")]
    long = frame[frame["status"] == "ok"].melt(id_vars=[hue, "run_id"], value_vars=cols, var_name="k")
    long = long.assign(budget=long["k"].str.removeprefix("rel_error@"), rel_error=long["value"])
    long = long.assign(status="ok", run_id=long["run_id"] + long["k"])
    means = cell_means(long, [hue, "budget"], ["rel_error"])
    files = figures.lines(means, "budget", "rel_error", hue, None, ctx.title, ctx.stem) if len(means) else []
    return wide_table(means, [hue], ["budget"], ["rel_error"]), files, []


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
    (``<experiment>_<scale>.md``/``.tex``, and ``.png``/``.pdf`` when it has a figure).

    ``overrides`` are the extra command-line overrides the sweep ran with (``seed=0,1,2``: each
    cell then averages the seeds).

    Raises
    ------
    KVBenchError
        For an unknown experiment.
    """
    base, jobs = sweep_jobs(experiment, scale, overrides)
    spec = base.report
    store = ResultStore(results_dir)
    several_models = len({job.cfg.model.name for job in jobs}) > 1
    index = list(spec.get("index", []))
    if several_models and "model" not in index:
        index = ["model", *index]
    keys = _ordered([*index, *(spec.get("columns") or []), "model"])
    records = read_records(jobs, store)
    frame = job_frame(jobs, records, keys)
    stem = Path(out_dir) / f"{experiment}_{scale}"
    models = ", ".join(_ordered(frame["model"].map(str)))
    title = f"{spec.title} ({scale}: {models})"
    table, files, extra = KINDS[spec.kind](Context(frame, spec, jobs, records, index, stem, title))
    distinct = frame.drop_duplicates("run_id")
    lines = [
        f"# {title}",
        "",
        f"Ours: model **{models}**, scale `{scale}`; {int((distinct['status'] == 'ok').sum())} of "
        f"{len(distinct)} distinct runs finished ({len(jobs)} sweep jobs); store `{store.root}`. "
        "Each cell is the mean over its finished runs.",
        "",
        _markdown(table),
    ]
    for heading, part in extra:
        lines += ["", f"## {heading}", "", _markdown(part)]
    missing = not_done(frame)
    lines += ["", "## Missing or failed runs", ""]
    lines.append(_markdown(missing) if len(missing) else "none")
    if files:
        lines += ["", "Figure: " + ", ".join(f"`{p.name}`" for p in files)]
    text = "\n".join(lines) + "\n"
    atomic_write_text(stem.with_suffix(".md"), text)
    atomic_write_text(stem.with_suffix(".tex"), _latex(table, title))
    return Report(text, table, [stem.with_suffix(".md"), stem.with_suffix(".tex"), *files])
