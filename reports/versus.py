"""Each compressed setting of a report against FullKV and against a baseline the user names
(``--baseline snapkv``): the paired difference of their scores on the same sample ids and its 95%
bootstrap interval (:func:`reports.paired.paired_difference`).

FullKV is the reference of its comparison group (model, task; RULER: model, length, protocol); the
baseline is the named method's setting in the same group at the same budget (RULER: compression
ratio, decoding rule and storage kind) and protocol. Runs of one setting (seeds) are averaged per
sample id. The runs compared were paired on the same samples by :func:`reports.pairing.pair`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from reports.paired import RESAMPLES, Difference, method_text, paired_difference
from reports.pairing import is_reference
from reports.persample import Scores, pooled
from tasks.errors import KVBenchError

#: The columns :func:`differences` adds (difference, its interval bounds), per compared-to.
COLUMNS = tuple(f"vs_{to}{end}" for to in ("fullkv", "baseline") for end in ("", "_low", "_high"))
FULLKV_HEADER = "Δ FullKV [95% CI]"


def check_baseline(name: str | None) -> None:
    """Refuse a ``--baseline`` that names no method or preset (``configs/method/*.yaml``), or FullKV.

    Raises
    ------
    KVBenchError
        For an unknown name (the message lists the known ones) or the reference.
    """
    from reports.presets import presets

    known = sorted(presets())
    if name is not None and name not in known:
        raise KVBenchError(f"--baseline {name} is not a method or preset (known: {', '.join(known)})")
    if name is not None and is_reference(name):
        raise KVBenchError(f"--baseline {name}: FullKV is every report's reference already; name a method")


@dataclass
class Compared:
    """:func:`differences`' result: the settings with :data:`COLUMNS` and ``paired_n``, the
    baseline's display label (None without ``--baseline``), the resamples and what the resampling
    was stratified by (None: not stratified)."""

    frame: pd.DataFrame
    baseline: str | None = None
    n_resamples: int = RESAMPLES
    stratified: str | None = None
    level: str = "budget"

    def headers(self) -> list[str]:
        """The Markdown headers of the difference columns."""
        return [FULLKV_HEADER] + ([f"Δ {self.baseline} [95% CI]"] if self.baseline else [])

    def text_columns(self, frame: pd.DataFrame | None = None) -> dict[str, list[str]]:
        """Header -> cell text of each row of ``frame`` (default :attr:`frame`): ``-4.20 [-7.10,
        -1.30]``, the difference alone below 5 samples, ``–`` where nothing is compared (FullKV,
        the baseline itself, no baseline at that budget, no per-sample scores)."""
        rows = self.frame if frame is None else frame
        out = {FULLKV_HEADER: [_text(r, "vs_fullkv") for r in rows.to_dict("records")]}
        if self.baseline:
            out[self.headers()[1]] = [_text(r, "vs_baseline") for r in rows.to_dict("records")]
        return out

    def table(self, keys: Mapping[str, str], frame: pd.DataFrame | None = None) -> pd.DataFrame:
        """One row per compressed setting of ``frame`` (default :attr:`frame`): its ``keys``
        (column -> header, as text), ``n`` (paired samples) and the difference columns."""
        rows = self.frame if frame is None else frame
        rows = rows[~rows["reference"].astype(bool)]
        shown = {header: [_key(v) for v in rows[column]] for column, header in keys.items()}
        n = [str(int(k)) if k else "–" for k in rows["paired_n"]]
        return pd.DataFrame(shown | {"n": n} | self.text_columns(rows))

    def markdown(self, keys: Mapping[str, str], what: str, frame: pd.DataFrame | None = None) -> str:
        """:meth:`table` as Markdown, then :meth:`caption`."""
        table = self.table(keys, frame).to_markdown(index=False, disable_numparse=True)
        return f"{table}\n\n{self.caption(frame, what)}"

    def caption(self, frame: pd.DataFrame | None = None, what: str = "the score") -> str:
        """One sentence on the difference columns of ``frame``'s rows (default :attr:`frame`): what
        they compare, the interval method and n (:func:`reports.paired.method_text`)."""
        rows = self.frame if frame is None else frame
        sizes = [int(n) for n in rows["paired_n"] if n > 0]
        if not sizes:
            return "Δ: no paired per-sample scores to compare (–)."
        against = "FullKV" + (f" and from {self.baseline} at the same {self.level}" if self.baseline else "")
        return (
            f"Δ: the difference in {what} from {against} on the same samples; "
            f"[95% CI]: {method_text(sizes, self.n_resamples, self.stratified)}."
        )


def _key(value: object) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:g}"
    return "–" if value is None else str(value)


def _text(row: dict, key: str) -> str:
    mean = row.get(key)
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return Difference(mean, row[f"{key}_low"], row[f"{key}_high"], int(row["paired_n"])).text()


def differences(
    settings: pd.DataFrame,
    scores: Sequence[Scores],
    by: Sequence[str],
    level: Sequence[str],
    baseline: str | None = None,
    n_resamples: int = RESAMPLES,
    stratified: str | None = None,
    level_name: str = "budget",
) -> Compared:
    """Each compressed setting's paired difference from FullKV and from the baseline.

    Parameters
    ----------
    settings : pandas.DataFrame
        One row per setting (or per run: rows of one ``label`` in one cell are pooled) with
        ``method`` (registry name), ``label``, ``reference`` (FullKV), optionally ``preset``, and
        the ``by`` and ``level`` columns.
    scores : Sequence[Scores]
        The per-sample scores of each row (:func:`reports.persample.run_scores`), in row order.
    by : Sequence[str]
        The columns of a comparison group (model, task): FullKV of the group is the reference.
    level : Sequence[str]
        The columns the baseline must share with a setting (budget or compression ratio, protocol).
    baseline : str | None
        A method (registry name) or preset: its setting at the same ``by`` and ``level``.
    n_resamples : int
        Bootstrap resamples (seed :data:`reports.paired.SEED`).
    stratified : str | None
        What the scores' strata are, for the caption (``task``).
    level_name : str
        What ``level`` is, for the caption (``budget``, ``compression ratio``).

    Raises
    ------
    KVBenchError
        When ``baseline`` has no row (no run on the compared samples), or two settings of it share
        a group and level (name a preset).
    """
    frame = settings.reset_index(drop=True).assign(_scores=list(scores))
    matches = _baseline_rows(frame, baseline) if baseline else frame.iloc[0:0]
    name = _display(matches.iloc[0]) if len(matches) else None
    keys = [*by, *level]
    for cell, part in matches.groupby(keys, sort=False, dropna=False):
        if part["label"].nunique() > 1:
            where = ", ".join(f"{k} {v}" for k, v in zip(keys, cell, strict=True))
            raise KVBenchError(
                f"--baseline {baseline} is ambiguous at {where}: {', '.join(part['label'].unique())}; "
                "name one preset, or keep one with --method"
            )
    values = {c: [math.nan] * len(frame) for c in COLUMNS} | {"paired_n": [0] * len(frame)}
    for _, group in frame.groupby(list(by), sort=False, dropna=False):
        reference = _pool(group[group["reference"]])
        for i, row in group[~group["reference"]].iterrows():
            cell = tuple(row[k] for k in keys)
            base = matches[[tuple(r) == cell for r in matches[keys].itertuples(index=False)]]
            against = [("vs_fullkv", reference)]
            if len(base) and row["label"] not in set(base["label"]):
                against.append(("vs_baseline", _pool(base)))
            for key, other in against:
                if not other.values or not row["_scores"].values:
                    continue
                d = paired_difference(row["_scores"].values, other.values, row["_scores"].strata, n_resamples)
                values[key][i], values[f"{key}_low"][i], values[f"{key}_high"][i] = d.mean, d.low, d.high
                values["paired_n"][i] = max(values["paired_n"][i], d.n)
    out = frame.drop(columns="_scores").assign(**values)
    return Compared(out, name, n_resamples, stratified, level_name)


def _display(row: pd.Series) -> str:
    """The baseline's name in headers: its method, or preset, without settings or protocol tags."""
    from reports.style import preset_label

    return preset_label(str(row["method"]), row.get("preset"))


def _pool(rows: pd.DataFrame) -> Scores:
    return pooled(list(rows["_scores"]))


def _baseline_rows(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    by_preset = frame["preset"] == name if "preset" in frame else pd.Series(False, index=frame.index)
    rows = frame[by_preset] if by_preset.any() else frame[frame["method"] == name]
    rows = rows[~rows["reference"]]
    if rows.empty:
        raise KVBenchError(
            f"--baseline {name}: no {name} run on the samples this report compares "
            "(runs on other samples are listed as not paired); run it there or name another baseline"
        )
    return rows
