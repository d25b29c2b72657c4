"""The leaderboard figure of ``python -m reports ruler``: what the table says, drawn. One panel per
(model, context length, protocol) and compression ratio (or kept fraction, ``--label budget``); in
it every compressed setting at that ratio is a dot at its paired difference in the RULER average
from FullKV (points x100) with its 95% interval as a bar, methods sorted by that difference (best on
top), FullKV the zero line. Every dot sits at its measured difference: nothing is moved to keep
equal values apart, since each method has a row of its own.

The score against the ratio, one line per method, is the companion figure (:mod:`reports.ruler_figure`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from reports import style
from reports.pairing import Pairing
from reports.ruler import GROUP, LABELS

#: Columns of the figure's CSV: a panel's keys, then each dot's numbers.
COLUMNS = [
    *GROUP,
    "level",
    "label",
    "method",
    "avg",
    "vs_fullkv",
    "vs_fullkv_low",
    "vs_fullkv_high",
    "paired_n",
    "rank",
]
#: Height of one method's row (inches) and of a panel's title and axis (inches).
ROW_INCHES, PANEL_INCHES = 0.2, 0.75


def dots(frame: pd.DataFrame, label: str = "ratio") -> pd.DataFrame:
    """The dots of ``frame`` (``reports.ruler_table.paired(...).frame``): its compressed rows with a
    paired difference from FullKV, ``level`` the ``--label`` column's value, ordered per panel by
    the difference (best first; ties in label order)."""
    column = LABELS[label][0]
    rows = frame[~frame["reference"].astype(bool) & frame["vs_fullkv"].notna()]
    rows = rows.assign(level=rows[column], _name=rows["label"].str.lower())
    if "rank" not in rows:
        rows = rows.assign(rank=pd.NA)
    rows = rows.sort_values([*GROUP, "level", "vs_fullkv", "_name"], ascending=[True] * 4 + [False, True])
    return rows[COLUMNS].reset_index(drop=True)


def draw(frame: pd.DataFrame, label: str = "ratio", pairing: Pairing | None = None) -> style.Plot:
    """The dot plot of :func:`dots` (its CSV the same rows). Settings without per-sample scores
    (no paired difference) are named in the caption, not drawn.

    Raises
    ------
    ValueError
        When no compressed setting has a paired difference from FullKV (nothing to draw).
    """
    data = dots(frame, label)
    if data.empty:
        raise ValueError("no compressed setting has a paired difference from FullKV: no dot to draw")
    panels = list(data.groupby([*GROUP, "level"], sort=False))
    groups = list(dict.fromkeys(key[:3] for key, _ in panels))
    heights = [len(part) * ROW_INCHES + PANEL_INCHES for _, part in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(7.5, sum(heights) + 1.2),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    low = data["vs_fullkv_low"].fillna(data["vs_fullkv"])
    high = data["vs_fullkv_high"].fillna(data["vs_fullkv"])
    span = (min(low.min(), 0.0), max(high.max(), 0.0))
    pad = 0.05 * (span[1] - span[0] or 1.0)
    level_name = "compression ratio" if label == "ratio" else "KV budget"
    for ax, ((model, length, protocol, level), part) in zip(axes[:, 0], panels, strict=True):
        y = list(range(len(part)))[::-1]  # best on top
        for yi, row in zip(y, part.itertuples(), strict=True):
            color = style.method_color(row.method)
            if pd.notna(row.vs_fullkv_low):
                ax.plot([row.vs_fullkv_low, row.vs_fullkv_high], [yi, yi], color=color, linewidth=1.6)
            ax.plot([row.vs_fullkv], [yi], "o", color=color, markersize=4.5, clip_on=False)
        ax.axvline(0.0, color=style.method_color("fullkv"), linestyle="--", linewidth=1.0)
        ax.set_yticks(y, [f"{row.label} ({row.avg:.1f})" for row in part.itertuples()], fontsize=7)
        ax.set_ylim(-0.7, len(part) - 0.3)
        ax.set_xlim(span[0] - pad, span[1] + pad)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        same = (frame["model"] == model) & (frame["length"] == length) & (frame["protocol"] == protocol)
        ref = frame[frame["reference"].astype(bool) & same]
        title = f"{level_name} {level:g}" + (f" (FullKV {ref['avg'].iloc[0]:.1f})" if len(ref) else "")
        if len(groups) > 1:
            title += f"\n{model}, {length:,} tokens, {protocol}"
        ax.set_title(title, fontsize=8, loc="left")
    axes[-1, 0].set_xlabel("Δ RULER average from FullKV (points x100), 95% paired interval", fontsize=8)
    heading = f"RULER leaderboard: each method against FullKV at its {level_name}"
    if len(groups) == 1:
        heading += ", {}, {:,} tokens, {}".format(*groups[0])
    style.title(fig, heading)
    left = frame[~frame["reference"].astype(bool) & frame["vs_fullkv"].isna()]
    note = (
        "Dot: the method's average minus FullKV's on the same samples (the table's Δ FullKV); bar: its 95% "
        "paired interval (none below 5 samples); dashed: FullKV (0). Rows sorted by Δ, best on top; the "
        "method's own average in brackets."
    )
    if len(left):
        note += " Not drawn (no per-sample scores): " + ", ".join(sorted(set(left["label"]))) + "."
    pairs = pairing.caption(brief=True) if pairing is not None else ""  # ruler.md names the samples
    style.caption(fig, " ".join(filter(None, [note, pairs])))
    return style.Plot(fig, data, "ruler", pairing.notes() if pairing is not None else [])
