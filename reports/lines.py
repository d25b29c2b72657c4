"""The lines of the budget and RULER figures (:mod:`reports.budget_figure`, :mod:`reports.ruler_figure`): one
line per method preset in its method's colour, dodged sideways so that equal values stay visible, the
reference (FullKV) as a dashed horizontal line, and the legend beside the axes."""

from __future__ import annotations

import pandas as pd
from matplotlib import transforms

from reports import style

#: Sideways distance between the lines of neighbouring methods (points, display only).
DODGE_POINTS = 5.0


def _legend_n(ns: pd.Series) -> str:
    low, high = int(ns.min()), int(ns.max())
    return f"n={low}" if low == high else f"n={low}-{high}"


def method_legend(ax, handles: dict, x: float = 1.01) -> None:
    """A legend of ``label -> handle`` beside ``ax`` (left edge at ``x`` axes widths), the
    reference (FullKV) on top."""
    order = sorted(handles, key=lambda t: "(reference" not in t)
    ax.legend(
        [handles[t] for t in order],
        order,
        title="method (preset)",
        fontsize=7,
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(x, 1),
        borderaxespad=0,
    )


def draw_reference(ax, ref: pd.Series, value: float) -> None:
    """The reference run (FullKV) ``ref`` as a dashed horizontal line at ``value``, in its colour."""
    ax.axhline(
        value,
        color=style.method_color(ref["method"]),
        linestyle="--",
        linewidth=1.2,
        label=f"{ref['label']} (reference, n={int(ref['n'])})",
    )


def draw_lines(ax, part: pd.DataFrame, dodge: bool = True) -> str:
    """One line (and band) per method preset, each shifted sideways by a few points (a dodge:
    equal values of several methods, e.g. all 0, stay visible instead of hiding each other), or
    at its exact x positions (``dodge=False``).
    A method's presets differ in line style and marker; where ``part`` holds quantized storage
    (its ``quant`` column) the marker names the storage kind instead (:func:`style.quant_marker`)
    and a method's presets over one kind differ in fill (:data:`style.FILLS`). Returns the caption
    sentence for those markers (:func:`style.quant_note`; empty without quantized storage)."""
    quants = set(part["quant"]) if "quant" in part else set()
    by_quant = bool(quants - {"none"})
    presets_seen: dict[str, list[str]] = {}
    fills_seen: dict[tuple[str, str], list[str]] = {}
    groups = part.groupby("label", sort=False)
    for i, (label, group) in enumerate(groups):
        shift = (i - (groups.ngroups - 1) / 2) * DODGE_POINTS if dodge else 0.0
        moved = transforms.offset_copy(ax.transData, fig=ax.figure, x=shift, y=0, units="points")
        group = group.sort_values("budget")
        method = group["method"].iloc[0]
        rank = presets_seen.setdefault(method, [])
        rank.append(label)
        color = style.method_color(method)
        line = style.LINESTYLES[(len(rank) - 1) % len(style.LINESTYLES)]
        marker, fill = style.MARKERS[(len(rank) - 1) % len(style.MARKERS)], "full"
        if by_quant:
            kind = group["quant"].iloc[0]
            same = fills_seen.setdefault((method, kind), [])
            same.append(label)
            marker, fill = style.quant_marker(kind), style.FILLS[(len(same) - 1) % len(style.FILLS)]
        text = f"{label} ({_legend_n(group['n'])})"
        outcome = group["budget_realised"].all()
        if outcome:  # the budget is where the method landed, not a setting: points, no line
            kept = ", ".join(f"{100 * b:.0f}%" for b in group["budget"])
            line, marker, text = (
                "none",
                "D",
                f"{label} (kept {kept}: budget is an outcome, {_legend_n(group['n'])})",
            )
        ax.plot(
            group["budget"],
            group["mean"],
            color=color,
            linestyle=line,
            marker=marker,
            markerfacecolor="none" if outcome else color,
            fillstyle="full" if outcome else fill,
            label=text,
            transform=moved,
            clip_on=False,  # a point at 0 on the axis stays whole
        )
        ax.update_datalim(list(zip(group["budget"], group["mean"], strict=True)))  # the undodged data
        banded = group[group["ci_low"].notna()]
        if len(banded):
            ax.fill_between(
                banded["budget"],
                banded["ci_low"],
                banded["ci_high"],
                color=color,
                alpha=0.15,
                transform=moved,
            )
    ax.autoscale_view()
    return style.quant_note(quants, half_filled=any(len(labels) > 1 for labels in fills_seen.values()))
