"""DuoAttention (Xiao et al. 2025, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval
and Streaming Heads"): head types from a pattern file, freed for real.

Sec. 3: a trained gate value per (layer, KV head) separates *retrieval heads*, which keep every token,
from *streaming heads*, which keep the attention sinks and a recent window (StreamingLLM per head).
Sec. 3.3 / the official ``sparsify_attention_heads``: for a target sparsity ``s``, the heads whose gate
is below the ``s``-quantile of all gates become streaming heads. The pattern is the official
``full_attention_heads.tsv`` (one row per layer, one tab-separated gate per KV head), given as a file
or as the folder the official scripts write (whose ``config.json`` records the sink and recent sizes
the gates were trained with; they must match this method's). Streaming heads keep their window while
decoding (the oldest non-sink token is evicted once over it); the budget is an outcome of the
pattern and the sparsity, as in the paper.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from methods.checks import check_range
from methods.scoring import lowest_score
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.traits import NO_DECODE_RULE, Traits


def load_pattern(path: str | Path) -> tuple[np.ndarray, dict]:
    """The gate table ``[layers, kv_heads]`` of a DuoAttention pattern and the folder's ``config.json``
    (empty for a bare file).

    Raises
    ------
    ValueError
        If the file is missing, not a numeric table, or has gates outside ``[0, 1]``.
    """
    path = Path(path).expanduser()
    folder = path if path.is_dir() else None
    table = path / "full_attention_heads.tsv" if folder else path
    if not table.is_file():
        raise ValueError(f"no DuoAttention pattern at {table}")
    try:
        gates = np.loadtxt(table, delimiter="\t", ndmin=2, dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"{table} is not a tab-separated table of gates: {err}") from err
    if gates.size == 0 or not np.isfinite(gates).all() or gates.min() < 0 or gates.max() > 1:
        raise ValueError(f"{table}: gates must be finite numbers in [0, 1]")
    config = folder / "config.json" if folder else None
    return gates, json.loads(config.read_text()) if config and config.is_file() else {}


def retrieval_heads(gates: np.ndarray, sparsity: float) -> np.ndarray:
    """``[layers, kv_heads]`` bool: heads at or above the ``sparsity``-quantile of the gates (all
    heads for sparsity 0, none for 1). Ties at the quantile stay retrieval heads (the official code
    breaks them with random noise; here the choice is deterministic)."""
    if sparsity <= 0:
        return np.ones_like(gates, dtype=bool)
    if sparsity >= 1:
        return np.zeros_like(gates, dtype=bool)
    return gates >= np.quantile(gates, sparsity)


@dataclass
class DuoAttention(CompressionMethod):
    """Retrieval heads keep everything, streaming heads keep sinks + a recent window.

    Parameters
    ----------
    pattern : str
        Path of the pattern (``full_attention_heads.tsv`` or the official folder holding it).
    sparsity : float
        Fraction of heads made streaming heads (paper's evaluations: 0.5 to 0.75).
    sink_size, recent_size : int
        Attention sinks and recent window of a streaming head (tokens; the official patterns: 64
        and 256).

    Raises
    ------
    ValueError
        For a missing or malformed pattern, sizes other than the pattern folder's ``config.json``,
        sparsity outside ``[0, 1]``, negative sizes, or (``check_model``) a pattern whose shape is not
        the model's ``[layers, kv_heads]``.
    """

    name: ClassVar[str] = "duo_attention"
    #: the budget is an outcome of the pattern; streaming heads evict while decoding (their own rule)
    TRAITS: ClassVar[Traits] = replace(NO_DECODE_RULE, budget_applies=False, ragged_heads=True)

    pattern: str | None = None
    sparsity: float = 0.5
    sink_size: int = 64
    recent_size: int = 256

    def __post_init__(self) -> None:
        if not self.pattern:
            raise ValueError("duo_attention needs method.pattern=<full_attention_heads.tsv or its folder>")
        check_range(self, "sparsity")
        if self.sink_size < 0 or self.recent_size < 1:
            raise ValueError("sink_size must be >= 0 and recent_size >= 1")
        gates, config = load_pattern(self.pattern)
        for key in ("sink_size", "recent_size"):
            if key in config and int(config[key]) != getattr(self, key):
                raise ValueError(
                    f"the pattern was trained with {key}={config[key]}; set method.{key}={config[key]}"
                )
        self.retrieval = torch.from_numpy(retrieval_heads(gates, self.sparsity))  # [layers, kv_heads] bool

    def check_model(self, config) -> None:
        """``decode_budget`` (refused: no decode-time rule); the pattern has one row per layer and one
        gate per KV head."""
        super().check_model(config)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        want = (config.num_hidden_layers, heads)
        if self.retrieval.shape != want:
            shape = tuple(self.retrieval.shape)
            raise ValueError(f"the pattern is {shape} (layers, KV heads); the model has {want}")

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """No uniform bound: each head's own (``bound`` of the streaming heads: sinks + recent)."""
        return LayerPlan(first=self.sink_size, recent=self.recent_size)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Streaming heads keep the first ``sink_size`` and last ``recent_size`` prompt tokens."""
        b, h, n = layer.store.positions.shape
        full = self.retrieval_heads(layer)
        pos = torch.arange(n, device=full.device)
        window = (pos < self.sink_size) | (pos >= n - self.recent_size)
        keep = (full[:, None] | window).expand(b, h, n)
        bounds = torch.where(full, -1, self.sink_size + self.recent_size).expand(b, h)
        layer.store = layer.store.ragged(keep, bounds)

    def retrieval_heads(self, layer: CompressedLayer) -> torch.Tensor:
        """``[kv_heads]`` bool: the layer's retrieval heads."""
        return self.retrieval[layer.spec.layer_idx].to(layer.keys.device)

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Streaming heads over their window evict their oldest non-sink token."""
        pos = layer.store.positions  # -1 on the padding of shorter heads: never a candidate
        over = ~self.retrieval_heads(layer) & (layer.store.head_slots() > self.sink_size + self.recent_size)
        layer.store.drop(lowest_score(pos, pos >= self.sink_size), over)
