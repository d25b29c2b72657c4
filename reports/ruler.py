"""``python -m reports ruler``: the RULER leaderboard as kvpress publishes it (``task=ruler``).

One table per protocol (model, context length, query-aware or not), one row per (method preset,
storage kind, decoding rule, compression ratio): the score of each RULER task the runs scored and
their average ``avg`` (the recorded metrics, x100), FullKV first; the figure
(:mod:`reports.ruler_figure`) draws the average against the compression ratio. kvpress's compression
ratio is the fraction of the compressed tokens removed, ``1 - budget`` for a budget given as a
fraction of the prompt (``budget_unit=prompt``); budgets in slots or in fractions of the context
window have none and are left out with a note.

Runs are compared only on the same samples (:mod:`reports.pairing`), per length: a run over several
lengths joins each length's table with that length's samples and ``<task>/len<L>`` scores. FullKV
compresses nothing, so it is the reference of both protocols of its model and length (FullKV over
quantized storage, ratio 0, joins both too, as a compared row). The tables,
with each setting's paired difference and rank, are :mod:`reports.ruler_table`'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pandas as pd

from reports.incomplete import attached, suffix
from reports.pairing import Pairing, is_reference, pair, sample_key
from reports.runs import Filters, decoding_tag, quant_tag, records_frame
from reports.style import preset_label
from reports.tables import budget_text
from reports.versus import COLUMNS
from runners.results.store import ResultStore, quant_of
from tasks.errors import KVBenchError
from tasks.generators.ruler_builders import TASKS

#: ``task.query_aware`` of a run recorded before the key existed: the runner then prefilled and
#: compressed the whole prompt, question included, i.e. query-aware. (The task's default today is
#: False, kvpress's protocol; it is not what those runs did.)
QUERY_AWARE_BEFORE_KEY = True
#: Protocol -> its name in tables and figures.
PROTOCOLS = {
    False: "query-agnostic (context compressed, then the question)",
    True: "query-aware (whole prompt compressed)",
    None: "FullKV only",
}
#: ``--label`` -> (the column a row is labelled by, its header).
LABELS = {
    "ratio": ("compression_ratio", "compression ratio"),
    "budget": ("budget", "budget (kept fraction)"),
}
GROUP = ["model", "length", "protocol"]
#: The columns of :func:`rows`' frame that are not scores (besides ``n/<task>``).
ROW_COLUMNS = frozenset(
    {"run_id", "model", "task", "method", "preset", "label", "reference", "length", "query_aware", "key"}
    | {"other_inputs", "protocol", "compression_ratio", "budget", "n", "avg", "runs", "run_ids"}
    | {"kv_mib", "kv_fraction", "decoding", "quant"}
    | {"rank", "paired_n", *COLUMNS}  # reports.ruler_table's
)


def _name(run: pd.Series, decoding: str) -> str:
    """A run's label in a RULER table: the other reports' (``preset_label``, its settings, the
    decoding tag ``decoding`` and the storage kind) without the query-aware tag, tables being per
    protocol."""
    tags = " ".join(t for t in (run["settings"], decoding, quant_tag(run["quant"])) if t)
    return preset_label(run["method"], run["preset"], tags)


def query_aware(record: dict) -> bool | None:
    """Whether a RULER run compressed the whole prompt (True) or the context before the question
    (False): ``config.task.query_aware``, else ``protocol.query_aware``, else (a run recorded
    before the key) :data:`QUERY_AWARE_BEFORE_KEY`. None for FullKV, which compresses nothing."""
    if record.get("method") == "fullkv":
        return None
    for where in ((record.get("config") or {}).get("task") or {}, record.get("protocol") or {}):
        if "query_aware" in where:
            return bool(where["query_aware"])
    return QUERY_AWARE_BEFORE_KEY


def predates_query_aware(record: dict) -> bool:
    """Whether a compressed RULER run was recorded before ``task.query_aware`` existed."""
    task = (record.get("config") or {}).get("task") or {}
    recorded = "query_aware" in task or "query_aware" in (record.get("protocol") or {})
    return record.get("method") != "fullkv" and not recorded


def compression_ratio(run: pd.Series, record: dict) -> tuple[float | None, str]:
    """kvpress's compression ratio of a run (0 for FullKV; ``config.compression_ratio`` where the
    user gave it, else ``1 - budget``) and, where it has none, why."""
    if is_reference(run["method"]):  # FullKV, over any storage kind, evicts nothing
        return 0.0, ""
    if run["budget_realised"]:
        return None, f"kept {100 * run['budget']:.0f}% of the prompt as an outcome (no budget set)"
    if run["budget_unit"] != "prompt":
        shown = budget_text(run["budget"], run["budget_unit"])
        return None, f"budget {shown} has no compression ratio (a ratio is of the prompt's compressed tokens)"
    given = (record.get("config") or {}).get("compression_ratio")
    return (float(given) if given is not None else round(1.0 - float(run["budget"]), 12)), ""


def _samples(store: ResultStore, run_id: str) -> list[dict]:
    path = store.run_dir(run_id) / "predictions.jsonl"
    if not path.is_file():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [{"id": p.get("id"), **(p.get("meta") or {})} for p in lines]


def _held(record: dict) -> dict[str, float]:
    """The KV memory a run held at the end of each sample, as recorded (``efficiency``): ``kv_mib``, the
    mean in MiB (codes, scales and zero points included for a quantized cache), and ``kv_fraction``, its
    bytes over FullKV's on the same samples, both summed over the samples (1 for FullKV); NaN where not
    recorded."""
    eff = record.get("efficiency") or {}
    mean, fraction = eff.get("kv_bytes_end_mean"), eff.get("kv_fraction_of_fullkv")
    unquantized = quant_of(record.get("config") or {}) == "none"
    if record.get("method") == "fullkv" and unquantized and fraction is None and mean is not None:
        fraction = 1.0
    nan = float("nan")
    mib = nan if mean is None else mean / 2**20
    return {"kv_mib": mib, "kv_fraction": nan if fraction is None else fraction}


def _scores(metrics: dict, length: int, several: bool) -> dict[str, float]:
    """``task -> score`` at ``length`` (``<task>/len<L>`` when the run had several lengths)."""
    if not several:
        return {k: v for k, v in metrics.items() if "/" not in k}
    suffix = re.compile(rf"^(?P<task>[^/]+)/len{length}$")
    return {m["task"]: v for k, v in metrics.items() if (m := suffix.match(k))}


@dataclass
class Rows:
    """What :func:`rows` read: one row per (run, length) the leaderboard compares, the pairing and
    notes about the runs left out."""

    frame: pd.DataFrame
    pairing: Pairing
    notes: list[str] = field(default_factory=list)


def rows(store: ResultStore, filters: Filters) -> Rows:
    """One row per (finished RULER quality run, length), paired on the same samples per
    (model, length, protocol): model, length (tokens), protocol (:data:`PROTOCOLS`), method,
    label, decoding (:func:`reports.runs.decoding_tag`), quant (storage kind), reference, budget
    (kept fraction, 1 for FullKV), compression_ratio, n, ``n/<task>`` (samples per task), one
    column per task score and ``avg``, run_id.

    Raises
    ------
    KVBenchError
        When ``filters`` name another task, or no finished RULER run with a compression ratio
        passes them (the message names the incomplete runs left out).
    """
    if filters.task not in (None, "ruler"):
        raise KVBenchError(f"reports ruler reads task=ruler runs (got --task {filters.task})")
    records = {r["run_id"]: r for r in store.records()}
    runs = records_frame(list(records.values()), Filters(**{**vars(filters), "task": "ruler"}))
    runs = runs[runs["runner"].isin(["quality", None])]
    notes, out = [], []
    for run in runs.to_dict("records"):
        record = records[run["run_id"]]
        decoding = decoding_tag(record)
        label = _name(run, decoding)
        ratio, why = compression_ratio(pd.Series(run), record)
        if ratio is None:
            notes.append(f"note: left out {label} (run {run['run_id'][:8]}): {why}")
            continue
        if predates_query_aware(record):
            notes.append(
                f"note: {label} (run {run['run_id'][:8]}) predates task.query_aware: "
                "counted as query-aware (its runner compressed the whole prompt)"
            )
        qa = query_aware(record)
        held = _held(record)
        lengths = list(run["task_config"].get("lengths") or [])
        samples = _samples(store, run["run_id"])
        for length in lengths:
            here = [s for s in samples if s.get("length", length) == length]
            ids = [s["id"] for s in here]
            recorded = ids and None not in ids
            key = frozenset(map(str, ids)) if recorded else sample_key(store, run["run_id"], run["n"])
            counts = pd.Series([s.get("task") for s in here], dtype=object).value_counts()
            scores = _scores(run["metrics"], length, len(lengths) > 1)
            out.append(
                {k: run[k] for k in ("run_id", "model", "task", "method", "preset", "reference")}
                | {
                    "other_inputs": run["other_inputs"],
                    "label": label,
                    "decoding": decoding,
                    "quant": run["quant"],
                }
                | {"length": length, "query_aware": qa, "key": key, "compression_ratio": ratio}
                | {
                    "budget": 1.0 if is_reference(run["method"]) else float(run["budget"]),
                    "n": len(here) or run["n"],
                }
                | held
                | {f"n/{t}": int(c) for t, c in counts.items() if t is not None}
                | scores
            )
    if not out:
        raise KVBenchError(
            f"no finished RULER runs with a compression ratio under {store.root}/runs; run e.g. "
            "`python run.py task=ruler method=snapkv compression_ratio=0.5`" + suffix(attached(runs))
        )
    pairing, kept = _pair(pd.DataFrame(out))
    pairing.incomplete = attached(runs)  # the runs' incomplete rows: named, never drawn
    return Rows(kept, pairing, notes)


def _pair(frame: pd.DataFrame) -> tuple[Pairing, pd.DataFrame]:
    """:func:`reports.pairing.pair` within each (model, length, protocol), FullKV of the same
    model and length (over any storage kind) joining every protocol; returns the merged pairing
    and the rows kept."""
    pairing, kept = Pairing(), []
    every = frame["query_aware"].isna()  # FullKV, over any storage kind: it compresses nothing
    groups = list(dict.fromkeys(frame[~every][["model", "length", "query_aware"]].itertuples(index=False)))
    groups += [
        (m, n, None) for m, n in dict.fromkeys(frame[every][["model", "length"]].itertuples(index=False))
    ]
    for model, length, qa in groups:
        same = (frame["model"] == model) & (frame["length"] == length)
        if qa is None and (same & ~every).any():
            continue  # FullKV already joins the compressed runs' tables
        part = frame[same & (every | (frame["query_aware"] == qa))]
        part = part.assign(protocol=PROTOCOLS[qa], length_key=f"{length:,} tokens")
        keys = dict(zip(part["run_id"], part["key"], strict=True))
        pairing.merge(found := pair(part, keys, by=("model", "task", "length_key", "protocol")))
        kept.append(part[part["run_id"].isin(found.kept)])
    return pairing, pd.concat(kept, ignore_index=True).drop(columns=["key", "length_key"])


def task_columns(frame: pd.DataFrame) -> list[str]:
    """The task score columns with a value, in RULER's order (unknown tasks after, sorted)."""
    scores = [c for c in frame.columns if c not in ROW_COLUMNS and not c.startswith("n/")]
    scores = [c for c in scores if frame[c].notna().any()]
    return [t for t in TASKS if t in scores] + sorted(c for c in scores if c not in TASKS)


def leaderboard(frame: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard rows of :func:`rows`' frame: per (model, length, protocol, label (which
    names the storage kind and decoding rule), compression ratio) the mean of each task score and
    of ``avg`` over its runs (seeds), their n, count and ids; FullKV first in each group, then by
    label and ratio."""
    tasks = task_columns(frame)
    counts = sorted(c for c in frame.columns if c.startswith("n/"))
    keys = [
        *GROUP,
        "method",
        "preset",
        "label",
        "decoding",
        "quant",
        "reference",
        "compression_ratio",
        "budget",
    ]
    board = (
        frame.groupby(keys, sort=False, dropna=False)
        .agg(
            **{c: (c, "mean") for c in ["avg", "kv_mib", "kv_fraction", *tasks]},
            **{c: (c, "first") for c in ["n", *counts]},
            runs=("run_id", "size"),
            run_ids=("run_id", " ".join),
        )
        .reset_index()
    )
    order = board.assign(first=~board["reference"], name=board["label"].str.lower())
    order = order.sort_values([*GROUP, "first", "name", "compression_ratio"], kind="stable")
    return order.drop(columns=["first", "name"]).reset_index(drop=True)
