"""The figure of ``python -m reports ruler``: the RULER average against kvpress's compression ratio
(or the kept fraction, ``--label budget``), one line per method preset in its colour
(:mod:`reports.style`), FullKV a dashed horizontal reference; one panel per (model, context
length, protocol), so query-aware and query-agnostic runs never share an axis."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from reports import style
from reports.lines import DODGE_POINTS, draw_lines, draw_reference, method_legend
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


def _x_limits(ax, ticks: list[float], n_lines: int) -> tuple[float, float]:
    """x limits that hold every dodged point: the outermost line is drawn ``(n_lines - 1) / 2 x
    DODGE_POINTS`` points (plus its marker) beside its tick, so the margin ``m`` in data units
    solves ``m = s (d + 2 m) / W`` (``s`` that distance and ``W`` the axes' width, in inches; ``d``
    the ticks' span)."""
    reach = ((n_lines - 1) / 2 * DODGE_POINTS + 6) / 72
    width = ax.get_position().width * ax.figure.get_figwidth() * 0.7  # the legend and layout shrink the axes
    span = max(ticks) - min(ticks) or 1.0
    margin = max(0.06, reach * span / max(width - 2 * reach, 0.5))
    return min(ticks) - margin, max(ticks) + margin


def draw(board: pd.DataFrame, label: str = "ratio", pairing: Pairing | None = None) -> style.Plot:
    """The figure of :func:`reports.ruler.leaderboard` rows; the plotted numbers are the
    leaderboard itself (its CSV). Methods at equal values are drawn a few points apart sideways
    (:func:`reports.lines.draw_lines`)."""
    column = LABELS[label][0]
    panels = list(board.groupby(GROUP, sort=False))
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.4 * columns + 3.2, 3.6 * rows + 0.9), squeeze=False)
    handles: dict[str, object] = {}
    markers: list[str] = []
    for ax, ((model, length, protocol), part) in zip(axes.flat, panels, strict=False):
        lines = part[~part["reference"]].assign(
            budget=part[column], mean=part["avg"], ci_low=np.nan, ci_high=np.nan, budget_realised=False
        )
        markers.append(draw_lines(ax, lines))
        for _, ref in part[part["reference"]].iterrows():
            draw_reference(ax, ref, ref["avg"])
        if len(lines):
            ticks = sorted(set(lines[column]))
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.set_xlim(*_x_limits(ax, ticks, lines["label"].nunique()))
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
        "Points: the recorded average of the RULER task scores; dashed: FullKV. Methods are drawn a few "
        f"points apart sideways so that equal values stay visible. {PROTOCOL_NOTE}"
    )
    note = " ".join([note, *dict.fromkeys(m for m in markers if m)])
    style.caption(fig, note + (" " + pairing.caption() if pairing is not None else ""))
    return style.Plot(fig, board, "ruler", pairing.notes() if pairing is not None else [])
