"""``python -m reports memory``: memory and throughput against the context length, FullKV vs the
methods, from the efficiency runner's records (``runner=efficiency``).

A run with ``runner.curve_every`` contributes its context-growth curve (one point every N decode
steps); a run without one contributes one point at ``prompt_len + gen_len`` (a sweep over
``runner.prompt_len`` then draws a curve across runs). Three panels: the KV cache bytes the method
holds (exact, from the cache), the memory of the device (CUDA ``memory_allocated``) or of the
process (CPU RSS, model included), and decode throughput.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from reports import incomplete as left_out
from reports import style
from reports.pairing import is_reference, newest_per_setting, other_inputs
from reports.runs import Filters, row
from runners.results.store import ResultStore
from tasks.errors import KVBenchError

PANELS = (  # column, axis label
    ("kv_mib", "KV cache held (MiB)"),
    ("memory_mib", "{memory} (MiB)"),
    ("tokens_per_s", "decode throughput (tokens/s)"),
)
MEMORY_NAMES = {"cuda": "device memory allocated", "cpu": "process memory (RSS, model included)"}


def _series(record: dict) -> str:
    r = row(record)
    shape = record.get("shape") or {}
    budget = r["budget"]
    where = (
        ""
        if budget is None
        else f" @ {budget} slots"
        if r["budget_unit"] == "slots"
        else f" @ {100 * budget:g}%"
    )
    batch_size = shape.get("batch_size", 1)
    return f"{r['label']}{where}" + (f", batch {batch_size}" if batch_size != 1 else "")


def record_points(record: dict, others: str = "") -> list[dict]:
    """The points of one efficiency record: its curve, or one point at prompt + generated tokens;
    ``others``: the run ids of its setting on other inputs (not drawn, named in the notes)."""
    r = row(record)
    eff, shape = record.get("efficiency") or {}, record.get("shape") or {}
    curve = record.get("curve") or [
        {
            "context": shape.get("prompt_len", 0) + shape.get("gen_len", 0),
            "kv_bytes": eff.get("kv_bytes_end"),
            "memory_bytes": eff.get("peak_memory_bytes"),
            "tokens_per_s": eff.get("decode_tokens_per_s"),
        }
    ]
    return [
        {
            "run_id": r["run_id"],
            "model": r["model"],
            "device": (record.get("device") or {}).get("type", "cpu"),
            "method": r["method"],
            "preset": r["preset"],
            "series": _series(record),
            "context": point["context"],
            "kv_mib": (point.get("kv_bytes") or 0) / 2**20,
            "memory_mib": (point.get("memory_bytes") or 0) / 2**20,
            "tokens_per_s": point.get("tokens_per_s"),
            "from_curve": bool(record.get("curve")),
            "other_inputs": others,
        }
        for point in curve
    ]


def curve_points(store: ResultStore, filters: Filters) -> pd.DataFrame:
    """One row per (run, context) point: model, device type, method, series label, context
    (tokens), KV MiB, memory MiB and decode tokens/s; one run per setting, the newest finished
    (``other_inputs`` names the others, :func:`reports.pairing.newest_per_setting`).

    The incomplete runs that pass the filters go with the points (:func:`reports.incomplete.attach`).

    Raises
    ------
    KVBenchError
        When no finished efficiency run passes the filters.
    """
    keep = Filters(**{**vars(filters), "runner": None}).keep
    records, others = newest_per_setting(store.records())
    runs = [(record, row(record)) for record in records]
    runs = [(record, r) for record, r in runs if r["runner"] == "efficiency" and keep(r)]
    rows = [
        point
        for record, r in runs
        if r["status"] == "ok"
        for point in record_points(record, others.get(record["run_id"], ""))
    ]
    left = [r for _, r in runs]  # the incomplete ones among them are named (reports.incomplete)
    if not rows:
        raise KVBenchError(
            f"no finished efficiency runs under {store.root}/runs match the filters; run e.g. "
            "`python run.py runner=efficiency runner.curve_every=32 method=zsmerge budget=128`"
            + left_out.suffix(left_out.of_rows(left))
        )
    points = pd.DataFrame(rows).sort_values(["model", "series", "context"]).reset_index(drop=True)
    return left_out.attach(points, left)


def draw(points: pd.DataFrame, title: str | None = None) -> style.Plot:
    """The three panels of the ``memory`` report (FullKV dashed, one colour per method), one row of
    panels per model: runs of two models are never drawn on one axis. A model without a FullKV run
    is named in the caption and the notes."""
    devices = sorted(set(points["device"]))
    memory = " / ".join(MEMORY_NAMES.get(d, d) for d in devices)
    models = list(dict.fromkeys(points["model"]))
    fig, axes = plt.subplots(len(models), 3, figsize=(14, 4.4 * len(models)), squeeze=False)
    for row_axes, model in zip(axes, models, strict=True):
        part = points[points["model"] == model]
        count = part["series"].nunique()
        for i, (series, group) in enumerate(part.groupby("series", sort=False)):
            method = group["method"].iloc[0]
            kwargs = {
                "color": style.method_color(method),
                "marker": style.MARKERS[i % len(style.MARKERS)],
                "markersize": 4,
                "linewidth": 1.2
                + 1.6 * (count - 1 - i) / max(count - 1, 1),  # overlapping lines stay visible
                "label": series,
                "linestyle": "--" if is_reference(method) else "-",
            }
            for ax, (column, _) in zip(row_axes, PANELS, strict=True):
                ax.plot(group["context"], group[column], **kwargs)
        for ax, (_, ylabel) in zip(row_axes, PANELS, strict=True):
            ax.set_xlabel(style.metric_label("context"))
            ax.set_ylabel(ylabel.format(memory=memory))
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
            if len(models) > 1:
                ax.set_title(model, fontsize=9)
        row_axes[0].legend(title="method (preset) @ budget", fontsize=7, title_fontsize=7)
    style.title(
        fig, title or f"Memory and decode throughput vs context ({', '.join(models)}, {', '.join(devices)})"
    )
    alone = [m for m in models if not points[points["model"] == m]["method"].map(is_reference).any()]
    notes = [f"note: no FullKV run of model {m} to compare with" for m in alone]
    others = other_inputs(points.drop_duplicates("run_id").rename(columns={"series": "label"}))
    notes += [o.note() for o in others] + left_out.notes(left_out.attached(points))
    style.caption(
        fig,
        "Points every runner.curve_every decode steps of one run (or one point per run at "
        "prompt_len + gen_len); dashed: FullKV; one row per model. KV cache: exact bytes of the kept "
        "keys and values."
        + (f" No FullKV run of {', '.join(alone)}." if alone else "")
        + "".join(f" {o.label} (run {o.run_id}) also run on other inputs: {o.ids()}." for o in others)
        + left_out.caption(left_out.attached(points)),
    )
    return style.Plot(fig, points, "memory_vs_context", notes)


def build(store: ResultStore, filters: Filters) -> list[style.Plot]:
    """The ``memory`` report: one :class:`~reports.style.Plot` (see :func:`draw`)."""
    return [draw(curve_points(store, filters))]
