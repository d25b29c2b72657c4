"""The paired differences of an experiment's table (``report.kind: table``): each compressed cell
of quality runs against FullKV and against ``--baseline`` at the same budget (the other table keys
alike), per metric of ``report.values``, on the same sample ids (:mod:`reports.versus`)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from reports.context import Context
from reports.frame import label
from reports.persample import setting_scores, stratum
from reports.runs import row
from reports.versus import differences
from tasks.errors import KVBenchError

#: The heading of the table in the Markdown and the LaTeX caption.
HEADING = "Paired differences from FullKV (95% CI)"


def paired_table(ctx: Context, keys: list[str], metrics: list[str]) -> pd.DataFrame | None:
    """One row per (compressed cell, metric): the cell's ``keys``, the metric, n and the difference
    columns; the caption (interval method, n, metrics without per-sample scores) in
    ``attrs["caption"]``. None when the experiment holds no finished quality run.

    Parameters
    ----------
    ctx : reports.context.Context
        The report's context (its ``baseline`` and ``n_resamples``).
    keys : list[str]
        The table's keys (index and columns); ``method`` and ``model`` name a setting, the others
        are the level a baseline must share (budget).
    metrics : list[str]
        The table's values.

    Raises
    ------
    KVBenchError
        When ``--baseline`` is given but the experiment has no quality run, or the baseline has no
        run on the compared samples.
    """
    settings = _cells(ctx, keys)
    if settings.empty:
        if ctx.baseline:
            raise KVBenchError(f"--baseline {ctx.baseline}: this experiment compares no quality runs")
        return None
    level = [f"key:{k}" for k in keys if k not in ("method", "model")] + ["protocol"]
    found, missing = [], []
    for metric in metrics:
        scores = [setting_scores(ctx.store, [r.run_ids], r.task, metric)[0] for r in settings.itertuples()]
        if not any(s.values for s in scores):
            missing.append(metric)
            continue
        strata = stratum(str(settings["task"].iloc[0]), metric)
        by = ["model", "task"]
        result = differences(settings, scores, by, level, ctx.baseline, ctx.n_resamples, strata)
        found.append((metric, result))
    if not found:
        return None
    shown = {f"key:{k}": k for k in keys}
    table = pd.concat([r.table(shown).assign(metric=m) for m, r in found], ignore_index=True)
    table = table[[*keys, "metric", *[c for c in table.columns if c not in (*keys, "metric")]]]
    every = replace(found[0][1], frame=pd.concat([r.frame for _, r in found]))
    caption = every.caption(what="each metric")
    if missing:
        caption += f" No per-sample scores of {', '.join(missing)} in predictions.jsonl: no difference shown."
    table.attrs["caption"] = caption
    return table


def _cells(ctx: Context, keys: list[str]) -> pd.DataFrame:
    """One row per table cell of finished quality runs: its keys (``key:<key>``, as table labels),
    the model, task, method, preset, reference, protocol and label of its runs, and their ids."""
    done = ctx.frame[ctx.frame["status"] == "ok"].drop_duplicates(["run_id", *keys])
    cells = []
    for cell, group in done.groupby(keys, sort=False, dropna=False):
        runs = [row(ctx.records[r]) for r in dict.fromkeys(group["run_id"])]
        runs = [r for r in runs if r["runner"] in ("quality", None)]
        if not runs:
            continue
        values = dict(zip(keys, cell if isinstance(cell, tuple) else (cell,), strict=True))
        first = runs[0]
        cells.append(
            {f"key:{k}": label(v) for k, v in values.items()}
            | {k: first[k] for k in ("model", "task", "method", "preset", "reference", "protocol")}
            | {"label": first["label"], "run_ids": " ".join(r["run_id"] for r in runs)}
        )
    return pd.DataFrame(cells)
