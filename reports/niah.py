"""``python -m reports niah``: the needle-in-a-haystack heatmap, context length x needle depth, one
panel per method preset and budget, from the ``<task>/len<L>/depth<d>`` metrics that generated
InfiniteBench grids record (``task=niah``); runs are paired on the same samples
(:mod:`reports.pairing`)."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from reports import style
from reports.incomplete import attach, suffix
from reports.pairing import Pairing, pair_frame
from reports.runs import Filters, runs_frame
from runners.results.sharded import INCOMPLETE
from runners.results.store import ResultStore
from tasks.errors import KVBenchError

CELL = re.compile(r"^(?P<needle>[^/]+)/len(?P<length>\d+)/depth(?P<depth>[0-9.eE+-]+)$")


def cells(store: ResultStore, filters: Filters, needle: str | None = None) -> tuple[pd.DataFrame, Pairing]:
    """One row per (run, length, depth) cell of the runs paired on the same samples
    (:func:`reports.pairing.pair`): model, label, method, budget (and unit), needle task, length
    (tokens), depth (fraction of the context), score (x100) and samples per cell. Returns the
    cells and the pairing (the runs left out and why, the needle grids left out as incomplete).

    Raises
    ------
    KVBenchError
        When no finished run passes the filters with grid metrics (or with ``needle``'s).
    """
    runs = runs_frame(store, filters)
    grids = [
        r for r in runs_frame(store, filters, INCOMPLETE).to_dict("records") if r["task_config"].get("depths")
    ]
    runs = attach(runs[runs["metrics"].map(lambda ms: any(CELL.match(k) for k in ms))], grids)
    pairing = pair_frame(store, runs)
    runs = runs[runs["run_id"].isin(pairing.kept)]
    rows = []
    for _, run in runs.iterrows():
        per_cell = run["task_config"].get("samples_per_cell") or 1
        for key, value in run["metrics"].items():
            match = CELL.match(key)
            if match is None or (needle and match["needle"] != needle):
                continue
            rows.append(
                {
                    "run_id": run["run_id"],
                    "model": run["model"],
                    "method": run["method"],
                    "label": run["label"],
                    "budget": run["budget"],
                    "budget_unit": run["budget_unit"],
                    "needle": match["needle"],
                    "length": int(match["length"]),
                    "depth": float(match["depth"]),
                    "score": value,
                    "n_per_cell": per_cell,
                }
            )
    if not rows:
        what = f"{needle!r} " if needle else ""
        raise KVBenchError(
            f"no finished runs with {what}needle grid metrics (<task>/len<L>/depth<d>) under "
            f"{store.root}/runs; run e.g. `python run.py task=niah task.lengths=[1000,2000] method=zsmerge`"
            + suffix(pairing.incomplete)
        )
    frame = pd.DataFrame(rows)
    first = frame["needle"].iloc[0]
    return frame[frame["needle"] == (needle or first)].reset_index(drop=True), pairing


def _panel_name(label: str, budget: object, unit: str | None) -> str:
    if budget is None or (isinstance(budget, float) and math.isnan(budget)):
        return label
    shown = f"{budget} slots" if unit == "slots" else f"{100 * float(budget):g}% of {unit}"
    return f"{label} @ {shown}"


def draw(frame: pd.DataFrame, pairing: Pairing | None = None) -> style.Plot:
    """Heatmaps of :func:`cells` rows: one panel per (model, label, budget), FullKV first, a shared
    0-100 colour scale, each cell annotated with its score; the runs ``pairing`` left out are named
    in the caption and the notes."""
    frame = frame.assign(panel=[_panel_name(r.label, r.budget, r.budget_unit) for r in frame.itertuples()])
    order = frame.assign(ref=frame["method"] != "fullkv", b=frame["budget"].fillna(np.inf))
    panels = list(
        dict.fromkeys(
            zip(
                *[order.sort_values(["model", "ref", "label", "b"])[k] for k in ("model", "panel")],
                strict=True,
            )
        )
    )
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(3.6 * columns + 0.8, 3.0 * rows + 0.6), squeeze=False, layout="constrained"
    )
    needle = frame["needle"].iloc[0]
    image = None
    for ax, (model, panel) in zip(axes.flat, panels, strict=False):
        part = frame[(frame["model"] == model) & (frame["panel"] == panel)]
        grid = part.pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
        image = ax.imshow(grid.to_numpy(), vmin=0, vmax=100, cmap="RdYlGn", aspect="auto", origin="upper")
        ax.set_xticks(range(len(grid.columns)), [f"{c:,}" for c in grid.columns], fontsize=7)
        ax.set_yticks(range(len(grid.index)), [f"{100 * d:g}%" for d in grid.index], fontsize=7)
        for (i, j), value in np.ndenumerate(grid.to_numpy()):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        ax.set_ylabel("needle depth (% of context)", fontsize=8)
        ax.set_title(panel if len({m for m, _ in panels}) == 1 else f"{panel}\n{model}", fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
    bar.set_label(style.metric_label(needle), fontsize=8)
    models = ", ".join(dict.fromkeys(frame["model"]))
    style.title(fig, f"Needle in a haystack ({needle}, {models}): score per context length and needle depth")
    data = frame.drop(columns="panel")
    notes = []
    if pairing is not None:
        fig.get_layout_engine().set(rect=(0, 0.06, 1, 0.94))  # room for the caption
        style.caption(fig, pairing.caption())
        notes = pairing.notes()
    return style.Plot(fig, data, f"niah_{needle}", notes)


def build(store: ResultStore, filters: Filters, metric: str | None = None) -> list[style.Plot]:
    """The ``niah`` report (``metric``: the needle task, e.g. ``passkey``; default the first)."""
    return [draw(*cells(store, filters, metric))]
