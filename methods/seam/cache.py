"""The compressed KV cache: a ``transformers.Cache`` whose layers hold only the kept slots.

Every method stores its state in :class:`~methods.seam.layer.CompressedLayer` objects, one per decoder
layer (slot storage and physical eviction: ``methods.seam.layer``), and each layer follows one rule
(``cache.rules``: the method, or the sliding-window rule on a sliding layer). The cache is handed to
the registered attention function (``methods.seam.attention``) on every forward call; that function
runs attention over the slots and lets the rule compress the layer right after it (docs/design.md,
"The cache seam"; ZSMerge Algorithm 1 order: append, attend, update scores, evict/merge). The byte
counts of a run are the cache's sums over its layers' stores.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers.cache_utils import Cache

from methods.seam.architecture import LayerSpec, layer_specs
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.sliding import SlidingWindow, sliding_bound
from methods.seam.step import layer_step, prepare_step
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore


class CompressedCache(Cache):
    """A ``transformers.Cache`` of :class:`CompressedLayer` for one batch of prompts.

    Full-attention layers follow ``method``; sliding-window layers follow
    :class:`~methods.seam.sliding.SlidingWindow` with ``min(budget, window - 1)`` slots (the rule of
    ``methods.seam.sliding``). Each layer's tensors live on the device of the keys it first receives,
    so a model sharded over several devices (``device_map``) keeps every layer's cache on that
    layer's device.

    Parameters
    ----------
    method : CompressionMethod
        The rules (scoring, eviction, merging) applied to every full-attention layer.
    budget : int | None
        Slots per (layer, KV head), already resolved for this sample (``runners.setup.budget``);
        None disables compression.
    specs : list[LayerSpec] | int
        One :class:`~methods.seam.architecture.LayerSpec` per decoder layer
        (:func:`~methods.seam.architecture.layer_specs`), or a layer count for plain full-attention
        layers without RoPE information.
    max_tokens : int | None
        Tokens the run will append at most (prompt + new tokens - 1), when known: caps every
        buffer (``CompressedLayer._capacity``).
    storage : StorageKind
        What makes each layer's first store: the run's storage kind (``quant=``,
        ``runners.setup.quant_kind.storage_of``); default the uniform full-precision store.

    Attributes
    ----------
    rules : list[CompressionMethod]
        Each layer's rule: ``method``, or the sliding-window rule on a sliding layer.
    """

    def __init__(
        self,
        method: CompressionMethod,
        budget: int | None,
        specs: list[LayerSpec] | int,
        max_tokens: int | None = None,
        storage: StorageKind = SlotStore,
    ) -> None:
        if isinstance(specs, int):
            specs = [LayerSpec() for _ in range(specs)]
        window_rule = SlidingWindow()
        layers, self.rules = [], []
        for i, spec in enumerate(specs):
            rule, bound = (
                (method, budget) if spec.window is None else (window_rule, sliding_bound(budget, spec.window))
            )
            spec = replace(spec, layer_idx=i, num_layers=len(specs))
            layers.append(CompressedLayer(rule.traits.state_fill, bound, spec, max_tokens, storage))
            self.rules.append(rule)
        super().__init__(layers=layers)
        self.method = method
        self.budget = budget

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        method: CompressionMethod,
        budget: int | None,
        max_tokens: int | None = None,
        storage: StorageKind = SlotStore,
    ) -> CompressedCache:
        """A cache for ``model``'s layers (:func:`~methods.seam.architecture.layer_specs`); ``max_tokens``
        and ``storage`` as in the class docstring.

        Raises
        ------
        UnsupportedArchitectureError
            For layer types the seam does not support.
        """
        return cls(method, budget, layer_specs(model), max_tokens, storage)

    def attend(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """The attention function's call on layer ``layer_idx`` (``methods.seam.step.layer_step`` under
        the layer's rule): output ``[batch, q_heads, q_len, head_dim]``."""
        return layer_step(self.rules[layer_idx], self.layers[layer_idx], query, key, value, scaling)

    def prepare_graph_step(self, k: int = 1) -> None:
        """Before a compiled decode step of ``k`` tokens, eagerly: every layer is prepared
        (``methods.seam.step.prepare_step``: room made, the step's tokens and slots counted, the rule's
        ``aux`` state created), and every tensor the step writes in place (store tensors,
        ``aux`` and ``scalars`` state, the layer's device count) is marked a static input, unguarded
        (``torch._dynamo.mark_static_address``; once per tensor: marking costs ~0.1 ms, a step's
        budget on a GPU a few ms): CUDA graph trees then capture the step with its in-place writes
        instead of skipping it, and re-record when a new sample's buffers move. Without this a buffer
        allocated inside the captured step would live in the graph's memory pool, overwritten by the
        next replay."""
        from torch._dynamo.utils import get_static_address_type  # loaded by then: the step compiles

        for rule, layer in zip(self.rules, self.layers, strict=True):
            prepare_step(rule, layer, k)
            counts = (t for t in (*layer.scalars.values(), layer._seen_device) if isinstance(t, torch.Tensor))
            for tensor in (*layer.store.tensors(), *layer.aux.values(), *counts):
                if get_static_address_type(tensor) is None:
                    torch._dynamo.mark_static_address(tensor, guard=False)

    @property
    def n_slots(self) -> list[int]:
        """Slots per layer (same for every head of a layer; ragged heads: the longest head's)."""
        return [layer.store.n_slots for layer in self.layers]

    def head_spread(self) -> list[tuple[int, float, int]]:
        """Per layer ``(min, mean, max)`` of the slots held by its KV heads (batch included)."""
        out = []
        for layer in self.layers:
            slots = layer.store.head_slots().float()
            out.append((int(slots.min()), round(float(slots.mean()), 2), int(slots.max())))
        return out

    def real_slots(self) -> list[float]:
        """Per layer, the mean over heads of the slots that can be attended (``log_weight > -inf``:
        KVMerger's padded heads and ragged heads' padding excluded)."""
        return [
            float(torch.isfinite(layer.store.log_weight).sum(-1).float().mean())
            if layer.store.n_slots
            else 0.0
            for layer in self.layers
        ]

    def kv_bytes(self) -> int:
        """Bytes of keys and values over all layers, plus the ``aux`` state that stands in for evicted
        tokens (exact, from the slot counts: ragged heads the sum over heads of their slots)."""
        return sum(layer.store.kv_bytes() + _bytes(layer.aux.values()) for layer in self.layers)

    def state_bytes(self) -> int:
        """Bytes of per-slot method state (bias, positions, scores, ...) over all layers."""
        return sum(layer.store.state_bytes() for layer in self.layers)

    def allocated_bytes(self) -> int:
        """Bytes of the storage behind all layers' stores and ``aux`` (buffer capacity included): what
        the cache really occupies."""
        return sum(
            layer.store.allocated_bytes() + sum(t.untyped_storage().nbytes() for t in layer.aux.values())
            for layer in self.layers
        )

    def counters(self) -> dict[str, int]:
        """The method's event counters (``Traits.counters``, e.g. merges) summed over layers."""
        return {
            name: int(sum(float(torch.as_tensor(layer.scalars.get(name, 0)).sum()) for layer in self.layers))
            for name in self.method.traits.counters
        }

    def bytes_per_token(self) -> int:
        """Key+value bytes one token occupies over all layers (batch included)."""
        return sum(layer.store.token_bytes() for layer in self.layers)

    def fullkv_bytes(self) -> int:
        """Key+value bytes the model's own uncompressed cache would hold for the tokens seen so far:
        every token, or on a sliding layer the last ``window - 1`` (transformers'
        ``DynamicSlidingWindowLayer``)."""
        total = 0
        for layer in self.layers:
            seen, window = layer.get_seq_length(), layer.spec.window
            total += (seen if window is None else min(seen, window - 1)) * layer.store.token_bytes()
        return total


def _bytes(tensors) -> int:
    """Bytes of the elements of ``tensors``."""
    return sum(t.numel() * t.element_size() for t in tensors)
