"""The companion figure of ``python -m reports ruler`` (``ruler_scores``): the RULER average against
kvpress's compression ratio (or the kept fraction, ``--label budget``), one line per method preset in
its colour (:mod:`reports.style`), every point at the ratio it was run at, FullKV a dashed
horizontal reference; one panel per (model, context length, protocol), so query-aware and
query-agnostic runs never share an axis. The leaderboard figure, with the paired intervals, is
:mod:`reports.ruler_dots`."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from reports import style
from reports.lines import draw_lines, draw_reference, method_legend
from reports.pairing import Pairing
from reports.ruler import GROUP, LABELS, task_columns

#: ``--label`` -> the x axis's label.
AXES = {
    "ratio": "compression ratio (fraction of the compressed tokens removed)",
    "budget": "KV budget (fraction of the compressed tokens kept)",
}
PROTOCOL_NOTE = (
    "Query-agnostic: the context is compressed, then the question is appended (kvpress's protocol); "
    "query-aware: the whole prompt, question included, is compressed."
)


def draw(board: pd.DataFrame, label: str = "ratio", pairing: Pairing | None = None) -> style.Plot:
    """The companion figure of :func:`reports.ruler.leaderboard` rows; the plotted numbers are the
    leaderboard itself (its CSV). Every point at its exact ratio: methods at equal values overlap
    (the dot plot, :mod:`reports.ruler_dots`, gives each its own row)."""
    column = LABELS[label][0]
    panels = list(board.groupby(GROUP, sort=False))
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    legend_inches = 0.17 * board["label"].nunique() + 0.5  # the legend beside the axes sets the height
    height = max(3.0 * rows, legend_inches) + 1.6
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns + 3.4, height), squeeze=False)
    handles: dict[str, object] = {}
    markers: list[str] = []
    for ax, ((model, length, protocol), part) in zip(axes.flat, panels, strict=False):
        lines = part[~part["reference"]].assign(
            budget=part[column], mean=part["avg"], ci_low=np.nan, ci_high=np.nan, budget_realised=False
        )
        markers.append(draw_lines(ax, lines, dodge=False))
        for _, ref in part[part["reference"]].iterrows():
            draw_reference(ax, ref, ref["avg"])
        if len(lines):
            ticks = sorted(set(lines[column]))
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            margin = 0.06 * ((max(ticks) - min(ticks)) or 1.0)
            ax.set_xlim(min(ticks) - margin, max(ticks) + margin)
        ax.set_ylim(0, 100 * 1.02)
        ax.set_xlabel(AXES[label], fontsize=8)
        ax.set_ylabel(f"average of {len(task_columns(part))} RULER tasks (x100)", fontsize=8)
        ax.set_title(f"{model}, {length:,} tokens\n{protocol}", fontsize=8)
        ax.grid(alpha=0.3)
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(text, handle)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    method_legend(axes[0][columns - 1], handles, x=1.02)
    x = "compression ratio" if label == "ratio" else "KV budget"
    style.title(fig, f"RULER: average score vs {x}")
    note = (
        "Points: the recorded average of the RULER task scores, at the ratios run; dashed: FullKV. Equal "
        f"values overlap: ruler.png gives each method a row, with its paired interval. {PROTOCOL_NOTE}"
    )
    note = " ".join([note, *dict.fromkeys(m for m in markers if m)])
    if pairing is not None and (pairing.unpaired or pairing.incomplete):
        note += " Runs on other samples or incomplete are not drawn (ruler.md names them)."
    style.caption(fig, note)
    return style.Plot(fig, board, "ruler_scores", [])
