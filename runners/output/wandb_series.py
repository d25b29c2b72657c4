"""The curves a run record holds, for W&B history and images (``runners.output.wandb_logger``): each
extractor of :data:`SERIES` turns one record into a :class:`Series` (rows sharing an x key, with
its own key prefix), and :func:`series_figure` draws one as a small matplotlib figure.

- ``context``: the efficiency runner's context-growth curve (``context/*`` vs ``context/context``);
- ``layer_error``: the error runner's per-layer errors (``layer_error/*`` vs ``layer_error/layer``);
- ``layer_kept``: the quality runner's prompt share kept per layer;
- ``train_loss``: LESS training losses (``train_loss/*`` vs ``train_loss/epoch``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MIB = 2**20
#: Legend names of the curves' y keys (others are shown as they are; ``rel_error@<b>`` as ``budget <b>``).
LEGEND = {
    "kv_bytes": "K/V held",
    "allocated_bytes": "buffers allocated",
    "train_mse": "train",
    "val_mse": "validation",
}


@dataclass
class Series:
    """One curve of a record: rows that share an x key.

    Attributes
    ----------
    name : str
        W&B key prefix (``<name>/<key>``) and figure name.
    x : str
        The x key of every row.
    rows : list[dict]
        One dict per point: ``x`` and the y values (numbers or None).
    panels : dict[str, tuple[list[str], str, float]]
        Figure panels: title -> (y keys drawn, axis label with unit, divisor applied to the values).
    x_label : str
        X axis label with unit.
    """

    name: str
    x: str
    rows: list[dict]
    panels: dict[str, tuple[list[str], str, float]] = field(default_factory=dict)
    x_label: str = ""


def context_curve(record: dict) -> Series | None:
    """The efficiency runner's context-growth points (``record["curve"]``; ZSMerge Figure 3): KV
    bytes, memory, step latency and tokens/s vs context (tokens)."""
    curve = record.get("curve")
    if not isinstance(curve, list) or not curve or "context" not in curve[0]:
        return None
    return Series(
        "context",
        "context",
        [dict(point) for point in curve],
        {
            "KV cache": (["kv_bytes", "allocated_bytes"], "MiB", MIB),
            "process / device memory": (["memory_bytes"], "MiB", MIB),
            "decode throughput": (["tokens_per_s"], "tokens/s", 1.0),
        },
        "context (tokens)",
    )


def layer_errors(record: dict) -> Series | None:
    """The error runner's relative attention-output error per layer, one key per budget
    (``rel_error@<budget>``; ZSMerge Figure 4 by layer)."""
    analysis = record.get("error_analysis")
    if not analysis or not analysis.get("per_layer"):
        return None
    keys = [f"rel_error@{b}" for b in analysis["budgets"]]
    layers = len(analysis["per_layer"][0])
    rows = [
        {"layer": i} | {k: row[i] for k, row in zip(keys, analysis["per_layer"], strict=True)}
        for i in range(layers)
    ]
    return Series(
        "layer_error",
        "layer",
        rows,
        {"relative error vs FullKV": (keys, "||o_c - o|| / ||o|| (unitless)", 1.0)},
        "decoder layer",
    )


def kept_per_layer(record: dict) -> Series | None:
    """The quality runner's share of each prompt kept after prefill, per layer (mean over samples)."""
    kept = (record.get("efficiency") or {}).get("prefill_kept_fraction_per_layer")
    if not kept:
        return None
    rows = [{"layer": i, "prefill_kept_fraction": v} for i, v in enumerate(kept)]
    return Series(
        "layer_kept",
        "layer",
        rows,
        {"prompt kept after prefill": (["prefill_kept_fraction"], "fraction of prompt tokens", 1.0)},
        "decoder layer",
    )


def training_loss(record: dict) -> Series | None:
    """LESS training (``runner=train_less``): train and validation MSE per epoch, summed over the
    trained layers (epoch 0: the untrained kernels' validation loss)."""
    curve = record.get("curve")
    if not isinstance(curve, list) or not curve or "epoch" not in curve[0]:
        return None
    rows = [
        {
            "epoch": point["epoch"],
            "train_mse": sum(point["train"].values()) if point.get("train") else None,
            "val_mse": sum(point["val"].values()) if point.get("val") else None,
        }
        for point in curve
    ]
    return Series(
        "train_loss",
        "epoch",
        rows,
        {"LESS kernels": (["train_mse", "val_mse"], "MSE, sum over layers", 1.0)},
        "epoch",
    )


#: Curve extractors: each returns the series a record holds, or None.
SERIES: dict[str, Callable[[dict], Series | None]] = {
    "context": context_curve,
    "layer_error": layer_errors,
    "layer_kept": kept_per_layer,
    "train_loss": training_loss,
}


def record_series(record: dict) -> list[Series]:
    """Every curve of ``record`` (:data:`SERIES`)."""
    return [s for extract in SERIES.values() if (s := extract(record)) is not None]


def series_figure(series: Series, title: str):
    """A small matplotlib figure of one series: one panel per entry of ``series.panels``, y values
    divided by the panel's divisor, labelled axes with units. Returns the ``Figure``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = {
        t: p for t, p in series.panels.items() if any(r.get(k) is not None for r in series.rows for k in p[0])
    }
    width = max(4.2 * len(panels), 5.6)  # room for the title of a one-panel figure
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(width, 3.4), squeeze=False)
    for ax, (panel, (keys, unit, scale)) in zip(axes[0], panels.items(), strict=False):
        for key in keys:
            points = [(r[series.x], r[key] / scale) for r in series.rows if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                label = LEGEND.get(key) or key.replace("rel_error@", "budget ")
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(series.x_label or series.x)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        low, high = ax.get_ylim()
        if low > 0:  # amounts: the axis starts at zero, with the usual headroom above
            ax.set_ylim(0, 1.05 * high)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
