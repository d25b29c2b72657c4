"""The compressed KV cache: a ``transformers.Cache`` whose layers hold only the kept slots.

Every method stores its state in :class:`~methods.layer.CompressedLayer` objects, one per decoder
layer (slot storage and physical eviction: ``methods.layer``). The cache is handed to the
registered attention function (``methods.attention``) on every forward call; that function runs
attention over the slots and lets the method compress the layer right after it (DESIGN.md,
"The cache seam"; ZSMerge Algorithm 1 order: append, attend, update scores, evict/merge).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache

from methods.layer import CompressedLayer

if TYPE_CHECKING:
    from methods.base import CompressionMethod


class CompressedCache(Cache):
    """A ``transformers.Cache`` of :class:`CompressedLayer` for one batch of prompts.

    Parameters
    ----------
    method : CompressionMethod
        The rules (scoring, eviction, merging) applied to every layer.
    num_layers : int
        Decoder layers of the model.
    budget : int | None
        Slots per (layer, KV head), already resolved for this sample (``methods.budget``);
        None disables compression.
    rotary_emb : torch.nn.Module | None
        The model's rotary embedding (``model.base_model.rotary_emb``), if it has one.
    """

    def __init__(
        self,
        method: CompressionMethod,
        num_layers: int,
        budget: int | None,
        rotary_emb: torch.nn.Module | None = None,
    ) -> None:
        super().__init__(
            layers=[CompressedLayer(method, budget, rotary_emb, i, num_layers) for i in range(num_layers)]
        )
        self.method = method
        self.budget = budget

    @property
    def n_slots(self) -> list[int]:
        """Slots per layer (same for every head of a layer)."""
        return [layer.n_slots for layer in self.layers]

    def kv_bytes(self) -> int:
        """Bytes of keys and values over all layers (exact, from tensor storage)."""
        return sum(layer.kv_bytes() for layer in self.layers)

    def state_bytes(self) -> int:
        """Bytes of per-slot method state over all layers."""
        return sum(layer.state_bytes() for layer in self.layers)

    def allocated_bytes(self) -> int:
        """Bytes of the storage behind all layers' slot tensors (buffer capacity included)."""
        return sum(layer.allocated_bytes() for layer in self.layers)

    def counters(self) -> dict[str, int]:
        """The method's event counters (``method.counters``, e.g. merges, fallbacks) summed over layers."""
        return {
            name: int(sum(layer.meta.get(name, 0) for layer in self.layers)) for name in self.method.counters
        }

    def bytes_per_token(self) -> int:
        """Key+value bytes one token occupies over all layers (batch included)."""
        total = 0
        for layer in self.layers:
            if layer.keys is not None:
                b, h, _, d = layer.keys.shape
                total += b * h * (d + layer.values.shape[-1]) * layer.keys.element_size()
        return total
