"""The tables of ``python -m reports ruler``: per (model, length, protocol) the leaderboard rows of
:func:`reports.ruler.leaderboard`, each compressed setting's paired difference in ``avg`` from
FullKV and from a ``--baseline`` at the same compression ratio, decoding rule and storage kind
(95% bootstrap over sample ids, stratified by task: :mod:`reports.paired`), and its rank with ties.

Rank: at each compression ratio, decoding rule and storage kind (:data:`LEVEL`), the best ``avg``
is rank 1 and so is every method whose paired interval against it includes 0; the rule repeats
among the rest, ranks counted as in competition ranking (1, 1, 3). Below 5 paired samples there is
no interval and no rank.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from reports.paired import RESAMPLES, Difference, paired_difference, tied_ranks
from reports.pairing import Pairing
from reports.persample import Scores, setting_scores
from reports.ruler import GROUP, LABELS, task_columns
from reports.runs import MIN_N
from reports.tables import DASH, display
from reports.versus import Compared, differences
from runners.results.store import ResultStore

RANK_NOTE = (
    "Rank: at each {level} the best avg is rank 1, and so is every method whose paired 95% "
    "interval against it includes 0; the rule repeats among the rest (ranks 1, 1, 3)."
)
#: What a setting shares with the baseline it is compared with and the settings it is ranked among:
#: the compression ratio, the decoding rule (``decoding``: empty for the task's own rule, else
#: ``decode-time`` or ``prompt-only``, :func:`reports.runs.decoding_tag`) and the storage kind
#: (``quant``), so neither a decode-time run nor a quantized one shifts the leaderboard rule's ranks.
LEVEL = ["compression_ratio", "decoding", "quant"]
#: ``--label`` -> what the rows' level is called in captions.
LEVELS = {"ratio": "compression ratio", "budget": "budget"}


def row_scores(store: ResultStore, board: pd.DataFrame) -> list[Scores]:
    """Per leaderboard row, its runs' per-sample ``score`` at the row's length (seeds averaged per
    sample id), each sample's RULER task its stratum."""
    return [setting_scores(store, [r.run_ids], "ruler", "avg", int(r.length))[0] for r in board.itertuples()]


def paired(
    board: pd.DataFrame, store: ResultStore, baseline: str | None = None, n_resamples: int = RESAMPLES
) -> Compared:
    """The leaderboard with the paired differences of ``avg`` (:func:`reports.versus.differences`:
    FullKV of the table, ``baseline`` at the same :data:`LEVEL`) and ``rank`` (see the module
    docstring; None for FullKV and without intervals).

    Raises
    ------
    KVBenchError
        When ``baseline`` has no run on a table's samples, or is ambiguous.
    """
    board = board.reset_index(drop=True)
    scores = row_scores(store, board)
    compared = differences(board, scores, GROUP, LEVEL, baseline, n_resamples, "task", LEVELS["ratio"])
    ranks: list[int | None] = [None] * len(board)
    compressed = board[~board["reference"]]
    for _, part in compressed.groupby([*GROUP, *LEVEL], sort=False):  # LEVEL's columns are never NaN
        rows = list(part.index)
        if any(not scores[i].values for i in rows):
            continue

        def versus(i: int, j: int, rows: list[int] = rows) -> Difference:
            mine, best = scores[rows[i]], scores[rows[j]]
            return paired_difference(mine.values, best.values, mine.strata, n_resamples)

        for i, rank in zip(rows, tied_ranks(list(part["avg"]), versus), strict=True):
            ranks[i] = rank
    compared.frame = compared.frame.assign(rank=pd.array(ranks, dtype="Int64"))
    return compared


def _kv_text(value: float) -> str:
    """A KV column's cell: 3 significant digits, a dash where not recorded."""
    return DASH if pd.isna(value) else f"{value:.3g}"


def by_score(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` ordered as a leaderboard: per (model, length, protocol) FullKV first, then by
    compression ratio, best ``avg`` first (ties in label order)."""
    order = frame.assign(_first=~frame["reference"], _avg=-frame["avg"], _name=frame["label"].str.lower())
    order = order.sort_values([*GROUP, "_first", "compression_ratio", "_avg", "_name"], kind="stable")
    return order.drop(columns=["_first", "_avg", "_name"])


def markdown(
    board: pd.DataFrame,
    label: str = "ratio",
    pairing: Pairing | None = None,
    compared: Compared | None = None,
) -> str:
    """One Markdown table per (model, length, protocol), rows :func:`by_score`: the method, its
    ``--label`` column, with ``compared`` (:func:`paired`) its rank and differences, the KV memory held
    at a sample's end (mean MiB, and the fraction of FullKV's bytes over the same samples), ``avg``
    and each task's score (2 decimals), under a heading with the samples per task and the interval
    method; then the samples compared and the runs left out (``pairing``)."""
    column, header = LABELS[label]
    rows = by_score(compared.frame if compared is not None else board)
    level = f"{LEVELS[label]}, decoding rule and storage kind"
    compared = replace(compared, level=level) if compared is not None else None
    parts = ["# RULER leaderboard (scores x100)"]
    for (model, length, protocol), part in rows.groupby(GROUP, sort=False):
        tasks = task_columns(part)
        per_task = ", ".join(f"{t} {int(part[f'n/{t}'].max())}" for t in tasks if f"n/{t}" in part)
        n = int(part["n"].max())
        parts += ["", f"## {model}, {length:,} tokens, {protocol}", ""]
        parts.append(f"Samples: {n}" + (f" ({per_task})" if per_task else "") + ".")
        shown = {"method": part["label"], header: part[column].map(lambda v: f"{v:g}")}
        if compared is not None:
            shown["rank"] = part["rank"].map(lambda r: DASH if pd.isna(r) else str(r))
            shown["avg"] = part["avg"]
            shown |= compared.text_columns(part)
        shown |= {"KV MiB": part["kv_mib"].map(_kv_text), "KV / FullKV": part["kv_fraction"].map(_kv_text)}
        table = pd.DataFrame(shown | {t: part[t] for t in ["avg", *tasks]})
        align = ("left", *["right"] * (table.shape[1] - 1))
        parts += ["", display(table).to_markdown(index=False, disable_numparse=True, colalign=align)]
        if compared is not None:
            unranked = part[~part["reference"]]["rank"].isna().any()
            note = RANK_NOTE.format(level=level)
            note += f" No rank without an interval (n < {MIN_N})." if unranked else ""
            parts += ["", f"{compared.caption(part, 'avg (points x100)')} {note}"]
    if pairing is not None and (pairing.unpaired or pairing.no_reference):
        parts += [
            "",
            "## Not compared",
            "",
            *[f"- {line.removeprefix('note: ')}" for line in pairing.unpaired_notes()],
        ]
    parts += pairing.other_section() if pairing is not None else []
    return "\n".join(parts) + "\n"
