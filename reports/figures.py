"""Figures of the experiment reports (matplotlib, Agg backend). Each function returns a
:class:`~reports.style.Plot` (figure + the plotted numbers); the caller saves PNG, PDF and CSV.

Points are means with their 95% interval and n; FullKV (budget none) is a dashed reference line;
methods keep their colour (:mod:`reports.style`); the paper's values, where the experiment stores
them for the model we ran, are hollow markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from reports import style
from reports.pairing import is_reference
from reports.presets import method_of
from reports.runs import MIN_N

_CYCLE = ("tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown")


@dataclass
class Hue:
    """How a hue key's values are named and coloured: ``method`` values are presets (display
    name, the method's colour); other keys take ``names`` (e.g. ``{"0": "eviction"}``) and a
    colour per value in order."""

    key: str
    names: dict[str, str] = field(default_factory=dict)
    title: str | None = None

    def label(self, value: object) -> str:
        """Legend text of a hue value."""
        text = str(value)
        if self.key == "method":
            return style.preset_label(method_of(text), text)
        return self.names.get(text, f"{self.key} = {text}")

    def color(self, value: object, order: list) -> str:
        """Colour of a hue value (``order``: every value of the figure, for non-method keys)."""
        if self.key == "method":
            return style.method_color(method_of(str(value)))
        return _CYCLE[order.index(value) % len(_CYCLE)]

    def is_reference(self, value: object) -> bool:
        """Whether a hue value without a budget is the reference (FullKV; any value of a hue
        that is no method, e.g. an ablation's baseline row)."""
        return self.key != "method" or is_reference(method_of(str(value)))

    def legend_title(self) -> str:
        """The legend's title."""
        return self.title or ("method (preset)" if self.key == "method" else self.key)


def _x_axis(ax, x: str, values: pd.Series, unit: str | None) -> None:
    if x == "budget":
        numeric = pd.to_numeric(values, errors="coerce").dropna()
        if unit != "slots" and len(numeric) and numeric.max() <= 1:
            style.percent_axis(ax, numeric)
            ax.set_xlabel(style.budget_label(unit).replace("fraction", "%"))
            return
        ax.set_xlabel(style.budget_label("slots" if unit == "slots" else unit))
        return
    ax.set_xlabel(style.metric_label(x))


def lines(
    points: pd.DataFrame,
    x: str,
    metrics: list[str],
    hue: Hue,
    title: str,
    unit: str | None = None,
    paper: pd.DataFrame | None = None,
    failed: dict[str, str] | None = None,
    log_y: bool = False,
    facet: str | None = None,
    note: str | None = None,
) -> style.Plot:
    """One panel per metric: ``mean`` against ``x`` per hue value with a 95% band (``low``,
    ``high``), n in the legend. Rows whose ``x`` is ``none`` are dashed reference lines.

    ``points`` has columns ``hue, x, metric, mean, low, high, n``; ``paper`` (optional) ``hue, x,
    metric, value``: the paper's numbers, drawn as hollow markers; ``failed``: hue value -> why
    it has no points (shown in the legend, never silently dropped). With ``facet`` (the key of a
    ``facet`` column) one panel per metric and facet value."""
    facets = list(dict.fromkeys(points["facet"])) if facet and "facet" in points else [None]
    panels = [(m, f) for f in facets for m in metrics]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 2.6, 4.2), squeeze=False)
    order = list(dict.fromkeys(points["hue"])) + list((failed or {}).keys())
    for ax, (metric, facet_value) in zip(axes[0], panels, strict=True):
        part = points[points["metric"] == metric]
        if facet_value is not None:
            part = part[part["facet"] == facet_value]
            ax.set_title(f"{facet} = {facet_value}", fontsize=9)
        for value, group in part.groupby("hue", sort=False):
            color, label = hue.color(value, order), hue.label(value)
            xs = pd.to_numeric(group["x"], errors="coerce")
            n = f"n={int(group['n'].min())}" if group["n"].notna().any() else ""
            if xs.isna().all():  # no budget: FullKV is the reference, another method's budget an outcome
                kind = "reference" if hue.is_reference(value) else "budget is an outcome"
                ax.axhline(
                    group["mean"].mean(),
                    linestyle="--" if kind == "reference" else ":",
                    color=color,
                    label=f"{label} ({kind}, {n})",
                )
                if group["low"].notna().any():
                    ax.axhspan(group["low"].mean(), group["high"].mean(), color=color, alpha=0.08)
                continue
            group = group.assign(xn=xs).sort_values("xn")
            named = f"{label} ({n})" if n else label
            ax.plot(group["xn"], group["mean"], marker="o", color=color, label=named)
            band = group[group["low"].notna()]
            if len(band):
                ax.fill_between(band["xn"], band["low"], band["high"], color=color, alpha=0.15)
        if paper is not None and len(paper):
            shown = paper[paper["metric"] == metric]
            if facet_value is not None and "facet" in shown:
                shown = shown[shown["facet"] == facet_value]
            _paper_markers(ax, shown, hue, order)
        for value, why in (failed or {}).items():
            ax.plot(
                [],
                [],
                marker="x",
                linestyle="none",
                color=hue.color(value, order),
                label=f"{hue.label(value)}: {why}",
            )
        _x_axis(ax, x, points["x"], unit)
        ax.set_ylabel(style.metric_label(metric))
        if log_y:
            ax.set_yscale("log")
        else:
            if len(part) and (part["mean"] >= 0).all():
                ax.set_ylim(bottom=0)
            ax.set_ylim(*style.clipped_limits(ax.get_ylim(), metric))
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].legend(
        handles,
        labels,
        title=hue.legend_title(),
        fontsize=7,
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.02, 1),
        borderaxespad=0,
    )
    style.title(fig, title)
    style.caption(
        fig,
        note
        or "Points: mean over samples; shaded: 95% t-interval over per-sample scores, clipped to the "
        f"metric's range, none where n < {MIN_N}; dashed: reference (FullKV); hollow markers: the "
        "paper's values."
        + (f" Smallest n = {int(points['n'].min())}." if _small(points) else ""),
    )
    data = points if paper is None or not len(paper) else pd.concat([points, paper.assign(source="paper")])
    return style.Plot(fig, data, "", [])


def _small(points: pd.DataFrame) -> bool:
    return bool(len(points)) and points["n"].notna().any() and int(points["n"].min()) < MIN_N


def _paper_markers(ax, paper: pd.DataFrame, hue: Hue, order: list) -> None:
    for value, group in paper.groupby("hue", sort=False):
        color = hue.color(value, order) if value in order else "black"
        xs = pd.to_numeric(group["x"], errors="coerce")
        if xs.isna().all():
            ax.axhline(
                group["value"].mean(),
                linestyle=":",
                color=color,
                linewidth=1,
                label=f"{hue.label(value)} (paper, reference)",
            )
            continue
        ax.plot(
            xs,
            group["value"],
            marker="D",
            markersize=7,
            markerfacecolor="none",
            linestyle="none",
            color=color,
            label=f"{hue.label(value)} (paper)",
        )


def sensitivity(
    points: pd.DataFrame, metrics: list[str], labels: dict[str, str], anchors: dict[str, float], title: str
) -> style.Plot:
    """One panel per hyperparameter (``knob``, in ``labels`` order): each metric's mean and 95%
    interval against the hyperparameter's ``value``, the anchor (the others' fixed value) marked.
    ``points`` columns: ``knob, value, metric, mean, low, high, n``."""
    knobs = [k for k in labels if k in set(points["knob"])]
    fig, axes = plt.subplots(len(knobs), 1, figsize=(6.4, 2.5 * len(knobs) + 0.8), squeeze=False)
    for ax, knob in zip(axes[:, 0], knobs, strict=True):
        part = points[points["knob"] == knob]
        for i, metric in enumerate(metrics):
            rows = part[part["metric"] == metric].sort_values("value")
            if rows.empty:
                continue
            err = [(rows["mean"] - rows["low"]).fillna(0), (rows["high"] - rows["mean"]).fillna(0)]
            ax.errorbar(
                rows["value"],
                rows["mean"],
                yerr=err,
                marker=style.MARKERS[i],
                capsize=2,
                color=_CYCLE[i],
                label=f"{style.metric_label(metric)} (n={int(rows['n'].min())})",
            )
        values = sorted(part["value"].astype(float).unique())
        if values and min(values) > 0 and max(values) / min(values) >= 16:
            ax.set_xscale("log", base=2)
        if all(float(v).is_integer() for v in values):
            ax.set_xticks(values, [f"{int(v)}" for v in values])
            ax.minorticks_off()
        if knob in anchors:
            ax.axvline(anchors[knob], color="gray", linestyle=":", linewidth=1.2)
            ax.annotate(
                "anchor",
                (anchors[knob], 1),
                xycoords=("data", "axes fraction"),
                xytext=(3, -10),
                textcoords="offset points",
                fontsize=7,
                color="gray",
            )
        ax.set_xlabel(labels[knob])
        ax.set_ylabel("ROUGE F1 (x100)")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(title="metric", fontsize=7, title_fontsize=7, loc="lower right")
    style.title(fig, title)
    style.caption(
        fig,
        "One hyperparameter moves at a time, the others stay at the anchor (dotted). Bars: 95% "
        "t-interval over samples.",
    )
    return style.Plot(fig, points, "", [])


def layer_range(per_layer: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per budget, the smallest and largest layer's error (``per_layer``: ``[budgets][layers]``)."""
    values = np.asarray(per_layer, dtype=float)
    return values.min(axis=1), values.max(axis=1)
