"""How reports name and draw things: display names of methods and presets, one colour per method
(the same in every figure), axis labels with units, and :func:`save` (PNG + PDF + the data as CSV).

Registries, not if/else chains: add a method to :data:`METHODS`, a metric to :data:`METRIC_LABELS`.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


@dataclass(frozen=True)
class MethodStyle:
    """Display name and colour of a registered method (``record["method"]``)."""

    name: str
    color: str


#: Registry name -> display name and colour (matplotlib's colour-blind-safe tab10 order).
METHODS: dict[str, MethodStyle] = {
    "fullkv": MethodStyle("FullKV", "#333333"),
    "h2o": MethodStyle("H2O", "tab:blue"),
    "snapkv": MethodStyle("SnapKV", "tab:orange"),
    "streamingllm": MethodStyle("StreamingLLM", "tab:green"),
    "less": MethodStyle("LESS", "tab:purple"),
    "zsmerge": MethodStyle("ZSMerge", "tab:red"),
    "kvmerger": MethodStyle("KVMerger", "tab:brown"),
    "keepkv": MethodStyle("KeepKV", "tab:pink"),
    "tova": MethodStyle("TOVA", "tab:olive"),
    "knorm": MethodStyle("KNorm", "tab:cyan"),
    "keydiff": MethodStyle("KeyDiff", "#6baed6"),
    "random": MethodStyle("Random", "tab:gray"),
    "expected_attention": MethodStyle("ExpectedAttention", "#8c6d31"),
    "lagkv": MethodStyle("LagKV", "#393b79"),
    "rkv": MethodStyle("R-KV", "#637939"),
    "pyramidkv": MethodStyle("PyramidKV", "#9c9ede"),
    "layer_ratios_snapkv": MethodStyle("SnapKV (layer ratios)", "#fdae6b"),
    "adakv_snapkv": MethodStyle("AdaKV-SnapKV", "#843c39"),
    "adakv_expected_attention": MethodStyle("AdaKV-ExpectedAttention", "#d6616b"),
    "criticalkv_snapkv": MethodStyle("CriticalKV-SnapKV", "#7b4173"),
    "duo_attention": MethodStyle("DuoAttention", "#3182bd"),
    "kvzip": MethodStyle("KVzip", "#00a087"),
    "observed_attention": MethodStyle("ObservedAttention", "#31a354"),
    "chunkkv": MethodStyle("ChunkKV", "#756bb1"),
    "dms_snapkv": MethodStyle("DMS-SnapKV", "#a55194"),
    "key_rerotation_snapkv": MethodStyle("KeyRerotation-SnapKV", "#e7969c"),
    "leverage_score": MethodStyle("LeverageScore", "#8ca252"),
    "cur": MethodStyle("CurDKV", "#bd9e39"),
    "simlayerkv": MethodStyle("SimLayerKV", "#17becf"),
    "non_causal_attn": MethodStyle("NonCausalAttn", "#9467bd"),
    "compactor": MethodStyle("Compactor", "#e6550d"),
    "cap": MethodStyle("CAPKV", "#e377c2"),
    "block": MethodStyle("Block-KeyDiff", "#7f7f7f"),
    "chunk": MethodStyle("Chunk-KNorm", "#fd8d3c"),
    "entropy_gated_chunkkv": MethodStyle("EntropyGatedChunkKV", "#74c476"),
    "finch": MethodStyle("FINCH", "#ff9896"),
    "merging": MethodStyle("Merging-KNorm", "#98df8a"),
    "cam": MethodStyle("CaM", "#ffbb78"),
    "kvcompose": MethodStyle("KVCompose", "#aec7e8"),
    "kvgrad": MethodStyle("KVgrad", "#c5b0d5"),
    "think": MethodStyle("ThinK", "#de9ed6"),
}
_SPARE = ("#bcbd22", "#9edae5", "#c49c94", "#dbdb8d", "#ad494a")
#: Line styles of a method's presets, in the order they are met (the method's own defaults first).
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")

#: Metric key -> axis label with its unit.
METRIC_LABELS: dict[str, str] = {
    "rouge1": "ROUGE-1 F1 (x100)",
    "rouge2": "ROUGE-2 F1 (x100)",
    "rougeL": "ROUGE-L F1 (x100)",
    "avg": "score (x100)",
    "accuracy": "accuracy (%)",
    "passkey": "passkey accuracy (%)",
    "number_string": "number-string accuracy (%)",
    "kv_retrieval": "KV-retrieval accuracy (%)",
    "rel_error": "attention-output error ||o' - o|| / ||o||",
    "tokens_per_s": "throughput (tokens/s)",
    "decode_tokens_per_s": "decode throughput (tokens/s)",
    "kv_mib": "KV cache held (MiB)",
    "memory_mib": "process memory (MiB)",
    "peak_mib": "peak memory (MiB)",
    "context": "context (tokens)",
    "runner.prompt_len": "prompt length (tokens)",
    "runner.gen_len": "generated tokens",
    "runner.batch_size": "batch size (sequences)",
}

#: Metric key -> the values it can take (an interval is clipped to them). Task metrics are scores
#: x100 (docs/results.md): a metric not listed here takes :data:`SCORE_RANGE`.
SCORE_RANGE = (0.0, 100.0)
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "rel_error": (0.0, math.inf),
    "tokens_per_s": (0.0, math.inf),
    "decode_tokens_per_s": (0.0, math.inf),
    "kv_mib": (0.0, math.inf),
    "memory_mib": (0.0, math.inf),
    "peak_mib": (0.0, math.inf),
}

#: ``budget_unit`` -> axis label of the budget.
BUDGET_LABELS: dict[str, str] = {
    "prompt": "KV budget (fraction of each prompt)",
    "context": "KV budget (fraction of the context window)",
    "slots": "KV budget (slots per layer and KV head)",
}


def method_name(method: str) -> str:
    """Display name of a registry name (``zsmerge`` -> ``ZSMerge``); unknown names as they are."""
    style = METHODS.get(method)
    return style.name if style else method


def method_color(method: str) -> str:
    """The colour of a method in every figure (a stable spare colour for an unregistered one)."""
    style = METHODS.get(method)
    return style.color if style else _SPARE[zlib.crc32(method.encode()) % len(_SPARE)]


#: Marker of each ``quant=`` storage kind in the memory figures (FullKV's star and the diamonds of
#: budgets that are outcomes take precedence).
QUANT_MARKERS = {"none": "o", "int8": "s", "int4": "^", "kivi2": "v", "kivi4": "P"}
#: What a caption calls each marker.
MARKER_NAMES = {
    "o": "circle", "s": "square", "^": "triangle up", "v": "triangle down", "P": "plus sign", "X": "cross",
}  # fmt: skip


#: Fill styles of one method's presets over one storage kind, in the order they are met, where the
#: marker names the storage kind (the first preset filled, the next ones half-filled).
FILLS = ("full", "left", "bottom", "right", "top")


def quant_marker(quant: str) -> str:
    """The marker of a ``quant=`` kind (:data:`QUANT_MARKERS`; ``X`` for an unlisted one)."""
    return QUANT_MARKERS.get(quant, "X")


def quant_note(quants: set[str], half_filled: bool = False) -> str:
    """The caption sentence naming the markers of storage kinds ``quants`` (:data:`QUANT_MARKERS`);
    empty when every run is unquantized. ``half_filled``: a method also has a second preset over one
    kind (:data:`FILLS`)."""
    if not quants - {"none"}:
        return ""
    kinds = [q for q in QUANT_MARKERS if q in quants] + sorted(quants - set(QUANT_MARKERS))
    note = "KV storage (quant=): " + ", ".join(f"{MARKER_NAMES[quant_marker(q)]} {q}" for q in kinds) + "."
    return note + (" Half-filled: a method's further presets over one storage kind." if half_filled else "")


def preset_label(method: str, preset: str | None, settings: str = "") -> str:
    """Display label of a run's method: ``ZSMerge``, ``ZSMerge (xsum_paper)`` for the preset
    ``zsmerge_xsum_paper``, plus hyperparameters set on the command line (``residual_ratio=0``)."""
    text = method_name(method)
    if preset and preset != method:
        text += f" ({preset.removeprefix(method + '_')})"
    return f"{text} {settings}".strip()


def metric_label(metric: str) -> str:
    """Axis label of a metric with its unit (``passkey/len2000/depth0.5`` -> the task's label)."""
    return METRIC_LABELS.get(metric) or METRIC_LABELS.get(metric.split("/")[0], metric)


def metric_range(metric: str | None) -> tuple[float, float]:
    """The smallest and largest value of a metric (``passkey/len2000/depth0.5`` by its task)."""
    if metric is None:
        return SCORE_RANGE
    return METRIC_RANGES.get(metric) or METRIC_RANGES.get(metric.split("/")[0], SCORE_RANGE)


def clipped_limits(limits: tuple[float, float], metric: str | None) -> tuple[float, float]:
    """Y-axis limits within the metric's range (:func:`metric_range`): 5% of room above the data
    (a FullKV line stays visible), never more than 2% of the range past its maximum."""
    low, high = metric_range(metric)
    bottom, top = limits
    ceiling = high + 0.02 * (high - low) if math.isfinite(high) else high
    return max(bottom, low), min(top + 0.05 * (top - bottom), ceiling)


def budget_label(unit: str | None) -> str:
    """Axis label of budgets in ``unit`` (``prompt``, ``context`` or ``slots``)."""
    return BUDGET_LABELS.get(unit or "prompt", f"KV budget ({unit})")


def title(fig, text: str) -> None:
    """A figure title wrapped to the figure's width."""
    width = int(fig.get_figwidth() * 13)
    fig.suptitle(textwrap.fill(text, width), fontsize=9)


def save(fig, stem: Path, data: pd.DataFrame | None = None) -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.pdf`` (and ``<stem>.csv``, the plotted numbers, when
    ``data`` is given), then close the figure; returns the paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    lines = getattr(fig, "caption_lines", 0)  # room for the caption (:func:`caption`), in points
    if fig.get_layout_engine() is None:  # constrained-layout figures (colour bars) place themselves
        fig.tight_layout(rect=(0, (lines * 8.5 + 4) / 72 / fig.get_figheight() if lines else 0, 1, 1))
    for path in paths:
        fig.savefig(path, dpi=150)
    plt.close(fig)
    if data is not None:
        data.to_csv(stem.with_suffix(".csv"), index=False)
        paths.append(stem.with_suffix(".csv"))
    return paths


@dataclass
class Plot:
    """A drawn figure before it is saved: the matplotlib ``Figure``, the numbers it shows (written
    as CSV beside it), the file stem, notes for the console (e.g. small-n warnings) and Markdown
    that goes with it (printed, and written as ``<stem>.md``; none when empty)."""

    fig: object
    data: pd.DataFrame
    stem: str
    notes: list[str]
    text: str = ""

    def save(self, out_dir: Path) -> list[Path]:
        """:func:`save` into ``out_dir``, and :attr:`text` as ``<stem>.md``."""
        paths = save(self.fig, Path(out_dir) / self.stem, self.data)
        if self.text:
            paths.append((Path(out_dir) / self.stem).with_suffix(".md"))
            paths[-1].write_text(self.text, encoding="utf-8")
        return paths


def caption(fig, text: str) -> None:
    """A small wrapped caption under the axes (what bands and lines mean, n)."""
    wrapped = textwrap.fill(text, int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.01, wrapped, fontsize=7, va="bottom", ha="left", color="#444444")
    fig.caption_lines = wrapped.count("\n") + 1


def percent_axis(ax, values) -> None:
    """Budget fractions on a log-2 x axis, ticks at the budgets drawn, labelled in percent."""
    ticks = sorted({float(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{100 * t:.3g}%" for t in ticks])  # a kept fraction: 52.2%
    ax.minorticks_off()
