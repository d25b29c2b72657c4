"""The stored runs as one frame, for reports that need no experiment file (``python -m reports
budget|niah|pareto|memory|runs``): identity, method preset and display label, budget and the
unit it is counted in, status, metrics, KV bytes and peak memory; per-sample scores and their
confidence interval.

Only the result store is read (``runners.results.store``); nothing here imports torch.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from reports.incomplete import attach
from reports.pairing import is_reference, model_key, newest_per_setting
from reports.presets import identify
from reports.style import metric_range, preset_label
from runners.results.store import ResultStore, quant_of

CONFIDENCE = 0.95
#: Below this many samples no interval is computed or drawn (reports say so): a t-interval with
#: one degree of freedom is wider than the metric's range.
MIN_N = 5
#: Below this many samples an interval is drawn but flagged as unreliable (reports say so).
SMALL_N = 10


def budget_axis(budget: object, unit: str | None) -> str | None:
    """What a budget counts: ``slots`` for an integer (absolute slots per layer and KV head), else
    the record's ``budget_unit`` (``prompt``/``context``); None when the run has no budget."""
    if budget is None or (isinstance(budget, float) and math.isnan(budget)):
        return None
    if isinstance(budget, int) and not isinstance(budget, bool):
        return "slots"
    return unit or "prompt"


def decoding_tag(record: dict) -> str:
    """``prompt-only`` or ``decode-time`` when a run decoded otherwise than its task's protocol says
    (``config.task.decode_budget``; unset: the method's paper rule): ``protocol.decoding`` against
    ``protocol.paper_decoding``; else empty (also for runs recorded before the key)."""
    proto = record.get("protocol") or {}
    rule = proto.get("decoding")
    default = ((record.get("config") or {}).get("task") or {}).get("decode_budget")
    expected = (
        proto.get("paper_decoding") if default is None else ("decode-time" if default else "prompt-only")
    )
    return rule if rule and rule != expected else ""


def quant_tag(quant: str) -> str:
    """A label's tag for ``quant=`` storage kind ``quant`` (:func:`runners.results.identity.quant_of`):
    ``quant=<kind>``, empty for ``none``."""
    return "" if quant == "none" else f"quant={quant}"


#: The label tag of a query-agnostic compressing run (:func:`protocol_tag`).
AGNOSTIC = "query_aware=false"


def protocol_tag(record: dict) -> str:
    """``query_aware=false`` for a compressing run whose question was appended after compression
    (``config.task.query_aware``), so reports never pool it with query-aware runs, its
    :func:`decoding_tag`, and ``quant=<name>`` for quantized storage; else empty."""
    task = (record.get("config") or {}).get("task") or {}
    agnostic = task.get("query_aware") is False and not is_reference(record.get("method") or "")
    tags = (
        AGNOSTIC if agnostic else "",
        decoding_tag(record),
        quant_tag(quant_of(record.get("config") or {})),
    )
    return " ".join(t for t in tags if t)


def row(record: dict) -> dict:
    """One flat row of a record for the reports (see the module docstring for the columns).

    ``reference`` is True for FullKV only (over unquantized storage: FullKV with ``quant=int8`` is
    compared with it, as a method). A run whose method ignores the budget (record budget
    null, e.g. KVMerger at a fixed theta) but recorded ``prefill_kept_fraction`` gets that
    realised fraction of the prompt as its budget, with ``budget_realised`` True."""
    cfg = record.get("config") or {}
    eff = record.get("efficiency") or {}
    method = record.get("method") or ""
    preset, settings = identify(method, cfg.get("method") or {}) if method else ("", "")
    budget, unit = cfg.get("budget"), cfg.get("budget_unit")
    kept = eff.get("prefill_kept_fraction")
    realised = budget is None and not is_reference(method) and kept is not None
    if realised:  # the method ignores the budget (KVMerger at a fixed theta): placed where it landed
        budget, unit = float(kept), "prompt"
    peak_device, peak_rss = eff.get("peak_device_bytes"), eff.get("peak_rss_bytes")
    return {
        "run_id": record["run_id"],
        "created": record.get("created"),
        "runner": (cfg.get("runner") or {}).get("name"),
        "model": model_key(record),
        "method": method,
        "preset": preset,
        "settings": settings,
        "label": preset_label(method, preset, f"{settings} {protocol_tag(record)}".strip()),
        "protocol": protocol_tag(record),
        "task": record.get("task"),
        "limit": (cfg.get("task") or {}).get("limit"),
        "task_config": cfg.get("task") or {},
        "budget": budget,
        "budget_unit": budget_axis(budget, unit),
        "budget_realised": realised,
        "reference": is_reference(method) and quant_of(cfg) == "none",
        "quant": quant_of(cfg),
        "seed": cfg.get("seed"),
        "status": record.get("status"),
        "error": record.get("error"),
        "n": record.get("samples_done", record.get("n_samples")),
        "kv_bytes": eff.get("kv_bytes_end_mean", eff.get("kv_bytes_end")),
        "fullkv_bytes": eff.get("fullkv_bytes_end_mean", eff.get("fullkv_bytes_end")),
        "peak_bytes": peak_device or eff.get("peak_memory_bytes") or peak_rss,
        "peak_kind": "device" if peak_device else "process",
        "metrics": record.get("metrics") or {},
    }


@dataclass
class Filters:
    """Which runs a report keeps (None: any). ``budget_unit`` keeps the runs counted in one unit."""

    task: str | None = None
    model: str | None = None
    method: Sequence[str] | None = None
    runner: str | None = None
    budget_unit: str | None = None
    limit: int | None = None

    def keep(self, r: dict) -> bool:
        """Whether row ``r`` (:func:`row`) passes every filter; a method filter matches the
        registry name, the preset name or the display label."""
        if self.method and not {r["method"], r["preset"], r["label"]} & set(self.method):
            return False
        if self.budget_unit and r["budget_unit"] not in (None, self.budget_unit):
            return False
        return all(
            want is None or r[key] == want
            for key, want in (
                ("task", self.task),
                ("model", self.model),
                ("runner", self.runner),
                ("limit", self.limit),
            )
        )


def runs_frame(
    store: ResultStore, filters: Filters | None = None, status: str | None = "ok", every: bool = False
) -> pd.DataFrame:
    """Rows (:func:`row`) of the store's records that pass ``filters`` with ``status`` (None: any):
    one run per setting unless ``every`` (:func:`records_frame`)."""
    return records_frame(store.records(), filters, status, every)


def records_frame(
    records: list[dict], filters: Filters | None = None, status: str | None = "ok", every: bool = False
) -> pd.DataFrame:
    """:func:`runs_frame` of records already read. Unless ``every``, a setting run on several inputs
    is one row, its newest finished run (:func:`reports.pairing.newest_per_setting`), whose
    ``other_inputs`` names the others (space-separated run ids; empty for most runs). The
    incomplete runs that pass ``filters`` but not ``status`` go with the frame
    (:func:`reports.incomplete.attach`), so that the report names them."""
    filters = filters or Filters()
    others: dict[str, str] = {}
    if not every:
        records, others = newest_per_setting(records)
    rows = [row(rec) | {"other_inputs": others.get(rec["run_id"], "")} for rec in records]
    rows = [r for r in rows if filters.keep(r)]
    kept = [r for r in rows if status is None or r["status"] == status]
    left = [r for r in rows if status is not None and r["status"] != status]
    return attach(pd.DataFrame(kept, columns=list(row_columns())), left)


def row_columns() -> list[str]:
    """The columns of :func:`runs_frame`."""
    return [
        "run_id",
        "created",
        "runner",
        "model",
        "method",
        "preset",
        "settings",
        "label",
        "protocol",
        "task",
        "limit",
        "task_config",
        "budget",
        "budget_unit",
        "budget_realised",
        "reference",
        "quant",
        "seed",
        "status",
        "error",
        "n",
        "kv_bytes",
        "fullkv_bytes",
        "peak_bytes",
        "peak_kind",
        "metrics",
        "other_inputs",
    ]


def sample_values(
    store: ResultStore, run_id: str, metric: str | None, any_metric: bool = False
) -> dict[str, float]:
    """Sample id -> value of ``metric`` in a run's ``predictions.jsonl`` (empty when absent). A
    sample without an id is keyed ``#<line>``, an id met again ``<id>#<k>`` (its k-th time), so
    that every line counts. ``any_metric``: a sample without ``metric`` gives its first metric."""
    path = store.run_dir(run_id) / "predictions.jsonl"
    if not path.is_file():
        return {}
    values: dict[str, float] = {}
    seen: Counter[str] = Counter()
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        prediction = json.loads(line) if line else {}
        per = prediction.get("metrics") or {}
        value = per.get(metric, next(iter(per.values()), None) if any_metric else None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            key = f"#{i}" if prediction.get("id") is None else str(prediction["id"])
            seen[key] += 1
            values[f"{key}#{seen[key]}" if seen[key] > 1 else key] = float(value)
    return values


def pooled_scores(per_run: Sequence[dict[str, float]]) -> list[float]:
    """One value per sample of runs scored on the same samples (:func:`sample_values` of several
    seeds): the mean over the runs that scored it, so that no sample counts twice (n = samples)."""
    pooled: dict[str, list[float]] = {}
    for values in per_run:
        for sid, value in values.items():
            pooled.setdefault(sid, []).append(value)
    return [sum(v) / len(v) for v in pooled.values()]


def mean_interval(scores: Sequence[float], metric: str | None = None) -> tuple[float, float, float]:
    """Mean and the two-sided 95% Student-t confidence interval of the mean, clipped to the range
    of ``metric`` (:func:`reports.style.metric_range`; task scores 0-100). The bounds are NaN below
    :data:`MIN_N` samples (callers say so); below :data:`SMALL_N` the interval is unreliable."""
    values = np.asarray(scores, dtype=float)
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size < MIN_N:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    low, high = metric_range(metric)
    return mean, max(mean - float(half), low), min(mean + float(half), high)


def primary_metric(frame: pd.DataFrame) -> str | None:
    """The first metric of the first run (the task's headline metric), None without runs."""
    for metrics in frame["metrics"]:
        if metrics:
            return next(iter(metrics))
    return None
