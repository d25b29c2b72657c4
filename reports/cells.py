"""Tables of cell means for the experiment reports (``reports.experiment``): one row per index
tuple with a column group per budget, FullKV as a reference row, the paper's numbers
(``report.paper.cells``) beside ours, and each cell's ratio to a reference cell (``report.ratio``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from reports import figures, tables
from reports.frame import label


def ordered(values) -> list:
    """``values`` without repeats, in first-seen order."""
    return list(dict.fromkeys(values))


def wide_table(means: pd.DataFrame, index: list[str], columns: list[str], values: list[str]) -> pd.DataFrame:
    """Cell means as a table: one row per ``index`` tuple and, per ``columns`` tuple (a budget),
    a group of one column per value (``"rouge1 @ 0.2"``), in the order the sweep lists them."""
    present = [v for v in values if v in means.columns]
    row_keys = ordered(map(tuple, means[index].itertuples(index=False))) if len(means) else []
    col_keys = ordered(map(tuple, means[columns].itertuples(index=False))) if columns else [()]
    lookup = {tuple(r[[*index, *columns]]): r for _, r in means.iterrows()}
    table: dict[str, list] = {k: [r[i] for r in row_keys] for i, k in enumerate(index)}
    for col in col_keys:
        for metric in present:
            header = metric if not col else f"{metric} @ {'/'.join(col)}"
            cells = [lookup.get(row + col) for row in row_keys]
            table[header] = [None if c is None else c[metric] for c in cells]
    frame = pd.DataFrame(table)
    empty = [c for c in frame.columns if c not in index and frame[c].isna().all()]
    return frame.drop(columns=empty)


def spread_reference(table: pd.DataFrame, index: list[str]) -> pd.DataFrame:
    """Rows that have numbers only in ``@ none`` columns (FullKV: no budget) get them in every
    budget group, and the ``@ none`` columns go: FullKV is a reference row, not its own group."""
    none_cols = [c for c in table.columns if c not in index and str(c).endswith(" @ none")]
    if not none_cols or len(none_cols) == len([c for c in table.columns if c not in index]):
        return table
    out = table.copy()
    others = [c for c in table.columns if c not in index and c not in none_cols]
    groups = ordered(c.rsplit(" @ ", 1)[1] for c in others if " @ " in c)
    reference = out[none_cols].notna().any(axis=1) & out[others].isna().all(axis=1)
    for col in none_cols:
        stem = col.removesuffix(" @ none")
        for group in groups:
            target = f"{stem} @ {group}"
            if target in out:
                out.loc[reference, target] = out.loc[reference, col]
    kept = out.drop(columns=none_cols)
    order = pd.concat([kept[reference], kept[~reference]])
    return order.reset_index(drop=True)


def paper_cells(spec: DictConfig, index: list[str], columns: list[str]) -> pd.DataFrame:
    """The paper's numbers (``report.paper.cells``) as cell means, keys as :func:`frame.label`."""
    cells = OmegaConf.to_container(spec.paper.cells, resolve=True) if spec.get("paper") else []
    frame = pd.DataFrame(cells)
    for key in ["model", *index, *columns]:
        if key not in frame:
            frame[key] = None
        frame[key] = frame[key].map(label)
    return frame


@dataclasses.dataclass(frozen=True)
class StandIn:
    """One of our models standing in for a paper's model: a random-weight model (``loader: random``)
    of the paper model's shape, ``paper`` its shape's name (``llama2-7b``), ``note`` what differs."""

    paper: str
    note: str


def stand_in(name: str, model: Mapping) -> StandIn | None:
    """What our model ``name`` (its config ``model``) stands in for in the paper's cells: a
    random-weight model of a named shape is the paper's model of that name (timings do not
    depend on weight values), at any depth; None for any other model."""
    if model.get("loader") != "random" or not model.get("shape"):
        return None
    layers = model.get("num_layers")
    depth = f"its first {layers} decoder layers" if layers else "every decoder layer"
    note = (
        f"Ours, {name}: {model['shape']}'s shape with random weights, {depth} "
        f"({model.get('dtype', 'float32')}); the paper's columns are its trained {model['shape']} "
        "at full depth on its hardware: compare the ratios, not tokens/s."
    )
    return StandIn(str(model["shape"]), note)


def with_stand_ins(paper: pd.DataFrame, stand_ins: Mapping[str, StandIn]) -> pd.DataFrame:
    """The paper's cells (:func:`paper_cells`) with, for each of our models that stands in for a
    paper model, a copy of that model's cells under our model's name."""
    copies = [paper[paper["model"] == s.paper].assign(model=name) for name, s in stand_ins.items()]
    copies = [c for c in copies if len(c)]
    return pd.concat([paper, *copies], ignore_index=True) if copies else paper


def ratio_table(
    means: pd.DataFrame,
    paper: pd.DataFrame,
    keys: list[str],
    value: str,
    reference: Mapping,
    model: str | None,
) -> pd.DataFrame:
    """Per cell (``keys``, labelled as :func:`frame.label`): ``value``, the reference cell's (the
    same keys with ``reference``'s values: ``{method: fullkv}`` is FullKV in the same setting),
    their ratio, and the paper's ``value`` and ratio for the same cell where the paper has both.
    ``means`` are our cell means (:func:`reports.frame.cell_means`), ``paper`` its cells
    (stand-ins included); ``model`` names our one model when ``keys`` has no ``model``."""
    ref = {k: label(v) for k, v in reference.items()}
    theirs = paper if model is None or "model" in keys else paper[paper["model"] == model]

    def lookup(frame: pd.DataFrame) -> dict[tuple, float]:
        if value not in frame:
            return {}
        done = frame.dropna(subset=[value])
        return {tuple(r[keys]): float(r[value]) for _, r in done.iterrows()}

    def ratio(top: float | None, bottom: float | None) -> float | None:
        return None if top is None or not bottom else top / bottom

    ours, papers = lookup(means), lookup(theirs)
    rows = []
    for cell in ordered(map(tuple, means[keys].itertuples(index=False))):
        against = tuple(ref.get(k, v) for k, v in zip(keys, cell, strict=True))
        mine, base = ours.get(cell), ours.get(against)
        theirs_value, theirs_base = papers.get(cell), papers.get(against)
        rows.append(
            {
                **dict(zip(keys, cell, strict=True)),
                value: mine,
                f"reference {value}": base,
                "ratio": ratio(mine, base),
                f"paper: {value}": theirs_value,
                "paper: ratio": ratio(theirs_value, theirs_base),
            }
        )
    table = pd.DataFrame(rows)
    empty = [c for c in (f"paper: {value}", "paper: ratio") if c in table and table[c].isna().all()]
    return table.drop(columns=empty)


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


def markdown(frame: pd.DataFrame) -> str:
    """The table as Markdown with display names and rounded numbers (``(no rows)`` when empty)."""
    if not len(frame):
        return "(no rows)"
    return tables.display(frame).to_markdown(index=False)


def display_keys(table: pd.DataFrame, hue: figures.Hue) -> pd.DataFrame:
    """The table with its hue column by display name (``ZSMerge (xsum_paper)``, ``eviction``)."""
    if hue.key not in table:
        return table
    return table.assign(**{hue.key: table[hue.key].map(hue.label)})
