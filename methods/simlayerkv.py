"""SimLayerKV (Zhang et al. 2024, "SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction",
arXiv 2410.13846; sail-sg/SimLayerKV; kvpress's ``SimLayerKVPress``): lazy layers keep only their
attention sinks and recent tokens, the other layers everything.

A layer is *lazy* when the last ``n_last`` prompt queries put more than ``lazy_threshold`` of their
attention on the first ``n_initial`` tokens and the ``n_recent`` tokens before the queries (mean over
the query heads and the window; ``simlayerkv_press.py``, ``n_last = 1``: the paper's
SimLayerKV-decode). As kvpress, a lazy layer keeps the sinks and the last ``n_recent - n_last``
prompt tokens, and nothing is compressed when the prompt has at most ``n_initial + n_recent + n_last``
tokens. While decoding (the paper's rule) a lazy layer keeps that window: once over it, the oldest
non-sink token is evicted, so each decode step attends to the sinks and the ``n_recent`` newest
tokens; with ``decode_budget=false`` (kvpress) it grows. Laziness is decided per batch row (kvpress:
over the batch); a lazy layer's heads are packed (``methods.seam.ragged``). The kept fraction is an
outcome (``Traits.budget_applies`` False); ``lazy_layers`` counts the lazy layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.checks import check_range, option
from methods.scoring import lowest_score, window_attention
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.traits import NO_DECODE_RULE, Traits


@dataclass
class SimLayerKV(CompressionMethod):
    """Lazy layers keep sinks + a recent window (module docstring).

    Parameters
    ----------
    lazy_threshold : float
        A layer is lazy above it (kvpress's recommendations: Llama-3 0.9, Llama-2 0.65, Mistral 0.8,
        Qwen 0.85; 1 compresses nothing).
    n_last : int
        Last prompt queries whose attention decides (1: SimLayerKV-decode, kvpress).
    n_recent : int
        Recent tokens of the laziness test and of a lazy layer's window (1024).
    n_initial : int
        Attention sinks (4).

    Raises
    ------
    ValueError
        For a threshold outside ``[0, 1]``, ``n_last`` < 1, ``n_recent`` < ``n_last``, ``n_initial`` < 0 or
        an empty window.
    """

    name: ClassVar[str] = "simlayerkv"
    TRAITS: ClassVar[Traits] = replace(
        NO_DECODE_RULE, budget_applies=False, counters=("lazy_layers",), ragged_heads=True
    )

    lazy_threshold: float = option(0.9, low=0, high=1)
    n_last: int = option(1, low=1)
    n_recent: int = option(1024, low=1, clamp="max_context")
    n_initial: int = option(4, low=0, high="max_context")

    def __post_init__(self) -> None:
        check_range(self, "lazy_threshold")
        if self.n_last < 1 or self.n_recent < self.n_last or self.n_initial < 0 or self.window < 1:
            raise ValueError("simlayerkv needs n_last >= 1, n_recent >= n_last, n_initial >= 0 and a window")

    @property
    def window(self) -> int:
        """Slots a lazy layer holds between decode steps: the sinks and ``n_recent - n_last`` tokens."""
        return self.n_initial + self.n_recent - self.n_last

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """No uniform bound: a lazy layer's heads get theirs at prefill."""
        return LayerPlan(first=self.n_initial, recent=self.n_recent - self.n_last)

    def lazy(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """``[batch]`` bool: the last ``n_last`` queries' attention on the sinks and on the ``n_recent``
        tokens before them, averaged over query heads and queries, is above ``lazy_threshold``
        (kvpress: the softmax over every key, the queries' own keys then left out of the sum)."""
        n = layer.store.n_slots - self.n_last
        attn = window_attention(query, layer.keys, self.n_last, scaling, layer.spec.softcap).mean((1, 2))
        share = attn[:, : self.n_initial].sum(-1) + attn[:, n - self.n_recent : n].sum(-1)
        return share > self.lazy_threshold

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Lazy rows keep the sinks and the last ``n_recent - n_last`` prompt tokens, packed with their
        window as bound (none when prompt-only); the others keep everything."""
        b, h, n = layer.store.positions.shape
        if self.lazy_threshold >= 1.0 or n <= self.n_initial + self.n_recent + self.n_last:
            return
        lazy = self.lazy(layer, query, scaling)
        if not bool(lazy.any()):
            return
        layer.scalars["lazy_layers"] = lazy.long()
        pos = torch.arange(n, device=lazy.device)
        window = (pos < self.n_initial) | (pos >= n - self.n_recent + self.n_last)
        keep = (window | ~lazy[:, None, None]).expand(b, h, n)
        bound = -1 if self.traits.prompt_only else self.window
        layer.store = layer.store.ragged(keep, torch.where(lazy, bound, -1)[:, None].expand(b, h))

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """A lazy row over its window evicts its oldest non-sink token."""
        lazy = layer.scalars.get("lazy_layers")
        if lazy is None:
            return
        pos = layer.store.positions  # -1 on the padding of shorter heads: never a candidate
        over = lazy.bool()[:, None] & (layer.store.head_slots() > self.window)
        layer.store.drop(lowest_score(pos, pos >= self.n_initial), over)
