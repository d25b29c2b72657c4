"""``python -m reports pareto``: quality against the KV cache memory it costs, one point per run
setting (method preset x budget), FullKV included, from the store's quality runs.

The x axis is the record's ``kv_bytes_end_mean`` (the key/value bytes held at the end of
generation, per sample), or with ``--memory peak`` the run's peak memory (device memory on CUDA,
else the process's peak RSS, which includes the model). Points up and to the left are better;
the upper-left staircase of all points is drawn as the Pareto front. Runs are paired on the same
samples (:mod:`reports.pairing`); each model has its own panel.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FuncFormatter

from reports import style
from reports.budget_figure import interval_note, quality_points
from reports.pairing import Pairing, is_reference
from reports.runs import AGNOSTIC, Filters
from runners.results.store import ResultStore

X_AXES = {  # --memory: (column, axis label)
    "kv": ("kv_mib", "KV cache held at the end of generation (MiB per sample)"),
    "peak": ("peak_mib", "peak device memory of the run (MiB)"),
}


def front(points: pd.DataFrame, x: str) -> pd.DataFrame:
    """The Pareto-optimal rows (no other row has less ``x`` and a higher ``mean``), by ``x``."""
    ordered = points.dropna(subset=[x]).sort_values([x, "mean"], ascending=[True, False])
    best, keep = float("-inf"), []
    for idx, r in ordered.iterrows():
        if r["mean"] > best:
            keep.append(idx)
            best = r["mean"]
    return ordered.loc[keep]


def draw(points: pd.DataFrame, metric: str, memory: str = "kv", pairing: Pairing | None = None) -> style.Plot:
    """Quality (mean with 95% interval bars) against memory, one colour per method, one panel per
    model (runs of two models are never compared); the runs ``pairing`` left out are named in the
    caption and the notes."""
    x, xlabel = X_AXES[memory]
    points, agnostic = shared_protocol(points)
    if memory == "peak" and (points["peak_kind"] == "process").any():
        xlabel = "peak process memory of the run (RSS, model included; MiB)"
    models = list(dict.fromkeys(points["model"]))
    many = points["label"].nunique() > 6  # the legend goes beside the axes, not over the points
    fig, axes = plt.subplots(1, len(models), figsize=((6.4 + 3.2 * many) * len(models), 4.6), squeeze=False)
    spread = points[x].max() / max(points[x].min(), 1e-9)
    log = spread >= 10  # a log axis only where the memory spans a decade or more
    for ax, model in zip(axes[0], models, strict=True):
        _panel(ax, points[points["model"] == model], x)
        if log:
            ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
        if (points["mean"] >= 0).all():
            ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel + (", log scale" if log else ""))
        ax.set_ylabel(style.metric_label(metric))
        ax.grid(alpha=0.3, which="both")
        outside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1)} if many else {}
        handles, labels = ax.get_legend_handles_labels()  # the front's line comes first: put it last
        order = sorted(range(len(labels)), key=lambda i: labels[i] == "Pareto front")
        ax.legend(
            [handles[i] for i in order],
            [labels[i] for i in order],
            title="method (preset)",
            fontsize=7,
            title_fontsize=7,
            **outside,
        )
        if len(models) > 1:
            ax.set_title(model, fontsize=9)
    task = points["task"].iloc[0]
    against = "KV memory" if memory == "kv" else "peak memory"
    style.title(fig, f"{task} ({', '.join(models)}): {style.metric_label(metric)} vs {against}")
    bars = (
        "bars: 95% t-interval"
        if points["ci_low"].notna().any()
        else f"no bars ({metric} has no per-sample values"
        + ("; paired intervals: python -m reports ruler)" if task == "ruler" else ")")
    )
    note = f"Points: mean over samples, labelled with the budget; {bars}; star: FullKV."
    if agnostic:
        note += f" Every compressed run {AGNOSTIC} (the context compressed, then the question appended)."
    quants = style.quant_note(set(points["quant"]))
    note += f" {quants}" if quants else ""
    if points["budget_realised"].any():
        note += (
            " Diamonds: methods whose budget is an outcome, labelled with the fraction of the prompt kept."
        )
    small, notes = interval_note(points)
    note += f" {small}" if small else ""
    if pairing is not None:
        note += " " + pairing.caption()
        notes += pairing.notes()
    style.caption(fig, note)
    return style.Plot(fig, points, f"pareto_{task}_{metric}_{memory}".replace("/", "-"), notes)


def shared_protocol(points: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """``points`` with the :data:`reports.runs.AGNOSTIC` tag taken off the labels when every compressing run
    carries it (the caption says it once), and whether it was; else ``points`` as they are."""
    compressing = points[~points["method"].map(is_reference)]
    if compressing.empty or not compressing["label"].str.split().map(lambda w: AGNOSTIC in w).all():
        return points, False
    strip = points["label"].str.split().map(lambda w: " ".join(t for t in w if t != AGNOSTIC))
    return points.assign(label=strip), True


def _legend_order(item: tuple[str, pd.DataFrame]) -> tuple[bool, str, int, str]:
    """Legend order of a ``(label, runs)`` group: the reference first, then by method, each method's
    storage kinds in :data:`style.QUANT_MARKERS` order (the Pareto front's line after them all)."""
    label, group = item
    kinds = list(style.QUANT_MARKERS)
    quant = group["quant"].iloc[0]
    return (
        not group["reference"].all(),
        group["method"].iloc[0],
        kinds.index(quant) if quant in kinds else len(kinds),
        label,
    )


def told_apart(points: pd.DataFrame) -> dict[str, str]:
    """Label -> the words that tell it apart from the other labels drawn in its colour and marker
    (one method over one storage kind: its presets, its decode-time run), for the points' annotations;
    labels alone in their colour and marker are left out."""
    drawn: dict[tuple, list[str]] = {}
    for label, group in points.groupby("label", sort=False):
        drawn.setdefault((group["method"].iloc[0], group["quant"].iloc[0]), []).append(label)
    out = {}
    for labels in drawn.values():
        if len(labels) > 1:
            common = set.intersection(*(set(label.split()) for label in labels))
            out |= {label: " ".join(w for w in label.split() if w not in common) for label in labels}
    return out


def _panel(ax, points: pd.DataFrame, x: str) -> None:
    """One model's points, method lines and Pareto front."""
    ax.margins(y=0.08)  # the star of FullKV, often the highest point, stays whole
    apart = told_apart(points)
    for rank, (label, group) in enumerate(sorted(points.groupby("label", sort=False), key=_legend_order)):
        group = group.sort_values(["budget", x])  # a method's line follows its budgets, not the x axis
        color, is_ref = style.method_color(group["method"].iloc[0]), group["reference"].all()
        outcome = group["budget_realised"].all()
        yerr = [(group["mean"] - group["ci_low"]).fillna(0), (group["ci_high"] - group["mean"]).fillna(0)]
        ax.errorbar(
            group[x],
            group["mean"],
            yerr=yerr,
            color=color,
            marker="*" if is_ref else "D" if outcome else style.quant_marker(group["quant"].iloc[0]),
            markersize=11 if is_ref else 5,
            linestyle="none" if is_ref or outcome else "-",
            capsize=2,
            label=f"{label} ({'reference, ' if is_ref else ''}n={int(group['n'].min())})",
        )
        for _, r in group[group["budget_unit"].notna()].iterrows():
            budget = f"{r['budget']}" if r["budget_unit"] == "slots" else f"{100 * r['budget']:.0f}%"
            text = f"kept {budget}" if r["budget_realised"] else budget
            ax.annotate(
                f"{text} {apart.get(label, '')}".strip(),
                (r[x], r["mean"]),
                textcoords="offset points",
                xytext=(5, 5 - 8 * (rank % 3)),
                fontsize=6,
                color=color,
            )
    pareto = front(points, x)
    ax.step(
        pareto[x],
        pareto["mean"],
        where="post",
        color="black",
        alpha=0.35,
        linewidth=3,
        zorder=0,
        label="Pareto front",
    )


def build(
    store: ResultStore, filters: Filters, metric: str | None = None, memory: str = "kv"
) -> list[style.Plot]:
    """The ``pareto`` report: one :class:`~reports.style.Plot` (see :func:`draw`)."""
    points, metric, pairing = quality_points(store, filters, metric)
    return [draw(points, metric, memory, pairing)]
