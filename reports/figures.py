"""Figures of the experiment reports (matplotlib, Agg backend): each function draws one figure from
cell means and saves it as PNG and PDF."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


def _numeric(values: pd.Series) -> pd.Series | None:
    converted = pd.to_numeric(values, errors="coerce")
    return None if converted.isna().all() else converted


def save(fig, stem: Path) -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.pdf``; returns both paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return paths


def lines(
    means: pd.DataFrame, x: str, y: str, hue: str, facet: str | None, title: str, stem: Path
) -> list[Path]:
    """``y`` against ``x`` per ``hue`` (one panel per ``facet`` value). Rows whose ``x`` is not a
    number (``none``: FullKV's budget) are drawn as dashed horizontal reference lines."""
    panels = list(dict.fromkeys(means[facet])) if facet else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        part = means if panel is None else means[means[facet] == panel]
        for name, group in part.groupby(hue, sort=False):
            xs = pd.to_numeric(group[x], errors="coerce")
            if xs.isna().all():
                ax.axhline(group[y].mean(), linestyle="--", color="gray", label=f"{name}")
                continue
            order = xs.argsort()
            ax.plot(xs.iloc[order], group[y].iloc[order], marker="o", label=str(name))
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        if panel is not None:
            ax.set_title(f"{facet} = {panel}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 60), fontsize=9)
    return save(fig, stem)


def sensitivity(
    means: pd.DataFrame, metrics: Sequence[str], labels: dict[str, str], title: str, stem: Path
) -> list[Path]:
    """One panel per hyperparameter (``knob`` column, in ``labels`` order): each metric against the
    hyperparameter's value (``value`` column) with the others at their anchor."""
    knobs = [k for k in labels if k in set(means["knob"])]
    fig, axes = plt.subplots(len(knobs), 1, figsize=(6, 2.6 * len(knobs)), squeeze=False)
    for ax, knob in zip(axes[:, 0], knobs, strict=True):
        part = means[means["knob"] == knob].sort_values("value")
        for metric in metrics:
            if metric in part:
                ax.plot(part["value"], part[metric], marker="o", label=metric)
        ax.set_xlabel(labels[knob])
        ax.set_ylabel("score")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 60), fontsize=9)
    return save(fig, stem)


def curves(points: pd.DataFrame, hue: str, title: str, stem: Path) -> list[Path]:
    """Decode tokens/s and memory (MiB) against the context length, one line per ``hue``."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, group in points.groupby(hue, sort=False):
        axes[0].plot(group["context"], group["tokens_per_s"], marker=".", label=str(name))
        axes[1].plot(group["context"], group["memory_mib"], marker=".", label=str(name))
    for ax, ylabel in zip(axes, ("decode tokens/s", "memory MiB"), strict=True):
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 60), fontsize=9)
    return save(fig, stem)
