"""One decoder layer of the compressed cache (:class:`CompressedLayer`): the transformers cache-layer
API over a storage object (``layer.store``, a :class:`~methods.seam.storage.SlotStorage`).

Keys and values are held at KV-head granularity (never repeated to query heads), with per-slot
state (``log_weight``, ``positions``, method scores). Compression is physical: the uniform store's
buffers hold the bound of the layer's plan (``layer.plan``, :class:`~methods.seam.plan.LayerPlan`, made
once by the layer's rule when the prompt arrives) plus the one slot a decode step appends before it
evicts; uncompressed layers are sized for the run's tokens (or grow geometrically). Methods read the
store's views and change them only through its operations; an allocator that gives heads their own
slot counts swaps the store for a ragged one. The layer never asks which kind it holds.
"""

from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import CacheLayerMixin

from methods.seam.architecture import LayerSpec
from methods.seam.plan import LayerPlan
from methods.seam.storage import SlotStorage, StorageKind
from methods.seam.uniform import SlotStore

__all__ = ["CompressedLayer"]


class CompressedLayer(CacheLayerMixin):
    """KV state of one decoder layer.

    The attributes below are what a method uses (docs/extending.md); the rest is transformers'
    cache-layer API (``update``, ``get_seq_length`` (tokens seen so far: the position of the next
    token), ``get_mask_sizes``, ``get_max_length``, ``lazy_initialization``).

    Attributes
    ----------
    store : SlotStorage
        Where the slots live (``methods.seam.storage``): views ``store.keys``, ``store.values``
        ``[batch, kv_heads, slots, head_dim]``, ``store.log_weight``, ``store.positions``
        ``[batch, kv_heads, slots]``, ``store.state`` (the method's fields), ``store.n_slots``,
        ``store.head_slots()``, and the only operations that change them.
    keys, values : torch.Tensor
        ``store.keys``, ``store.values`` (transformers' names).
    plan : LayerPlan | None
        The rule's budget arithmetic for this layer and sample (``methods.seam.plan``): set by the
        seam when the prompt has been appended, before the rule's prefill (None before: the layer
        is not prefilled yet).
    scalars : dict[str, torch.Tensor | int]
        Method numbers of the layer that change during a sample: event counters (those named in
        ``Traits.counters`` are summed into the run record; KeepKV keeps them per head), ZSMerge's
        residual-slot count, KeepKV's EMA constants; device tensors stay on the device (no host
        synchronisation per step).
    aux : dict[str, torch.Tensor]
        Fixed-size per-head state that stands in for evicted tokens (LESS: ``H``
        ``[batch, kv_heads, R, head_dim]`` and ``z`` ``[batch, kv_heads, R]``; StreamingLLM's original
        sink keys); counted in the cache's KV bytes, since it replaces cache memory.
    budget : int | None
        Slot budget resolved for the current sample (None: no compression).
    share : float | None
        The share of the prompt the budget was floored from (a :class:`~methods.seam.plan.Slots`
        budget), else None; :func:`~methods.seam.plan.budget_share` reads it.
    question : int | None
        The question's tokens at the end of the prompt (a ``Slots`` budget's ``question``), else None.
    spec : LayerSpec
        What the model's architecture says of this layer (``methods.seam.architecture``): its index,
        sliding window (None for full attention), logit soft-cap and rotary embedding.

    Parameters
    ----------
    fills : dict[str, float]
        The rule's per-slot state fields and their fill values (``Traits.state_fill``).
    budget, spec
        As the attributes.
    max_tokens : int | None
        Tokens the run will append at most (prompt + new tokens - 1), when known: no buffer is
        ever larger (a budget above the prompt allocates nothing it cannot use).
    storage : StorageKind
        What makes the layer's first store (default: the uniform :class:`SlotStore`).
    """

    def __init__(
        self,
        fills: dict[str, float],
        budget: int | None,
        spec: LayerSpec | None = None,
        max_tokens: int | None = None,
        storage: StorageKind = SlotStore,
    ) -> None:
        self.is_initialized = False  # no CacheLayerMixin.__init__: keys/values are store views here
        self._max_tokens = max_tokens
        self._seen = 0
        self._counted = 0  # tokens of the next update already in ``_seen`` (``_count_ahead``)
        self._seen_device: torch.Tensor | None = None  # read by ``tokens_seen`` in compiled steps
        self.budget = None if budget is None else int(budget)  # a plain int in compiled steps
        self.share: float | None = getattr(budget, "share", None)  # ``methods.seam.plan.Slots``
        self.question: int | None = getattr(budget, "question", None)
        self.spec = spec if spec is not None else LayerSpec()
        owner = weakref.ref(self)  # no layer <-> store cycle: the cache is freed by reference counting
        self.store: SlotStorage = storage(fills, lambda needed: owner()._capacity(needed))
        self.plan: LayerPlan | None = None
        self.scalars: dict[str, torch.Tensor | int] = {}
        self.aux: dict[str, torch.Tensor] = {}

    @property
    def keys(self) -> torch.Tensor:
        """``[batch, kv_heads, slots, head_dim]`` post-RoPE keys (``store.keys``)."""
        return self.store.keys

    @property
    def values(self) -> torch.Tensor:
        """``[batch, kv_heads, slots, head_dim]`` values (``store.values``)."""
        return self.store.values

    # ------------------------------------------------------------------ transformers API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate ahead: the store allocates on its first append (transformers'
        ``CacheLayerMixin``)."""
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new tokens' keys/values ``[batch, kv_heads, new, head_dim]`` and return them (the
        attention reads the layer's store). A chunk (several tokens on a prefilled layer) is returned
        unappended: the attention appends it token by token (``methods.seam.step.layer_step``)."""
        self.is_initialized = True
        new = key_states.shape[2]
        if self.plan is None or new == 1:
            if self._seen_device is None:
                self._seen_device = torch.zeros((), dtype=torch.long, device=key_states.device)
            if torch.compiler.is_compiling():
                positions = self._seen_device + torch.arange(new, device=key_states.device)
            else:
                positions = torch.arange(self._seen, self._seen + new, device=key_states.device)
            self.store.append(key_states, value_states, positions)
            self._seen_device += new
            if self._counted:  # counted before a compiled step (no host count inside its graph)
                self._counted = 0
            else:
                self._seen += new
        return key_states, value_states

    def _count_ahead(self, new: int) -> None:
        """Count the ``new`` tokens of the next :meth:`update` now, outside a compiled step (called by
        ``CompressedCache.prepare_graph_step``): ``get_seq_length()`` reads the same inside the step
        as after an eager update, and the step's graph takes no host count."""
        self._seen += new
        self._counted = new

    def _capacity(self, needed: int) -> int:
        """Slots to allocate when a buffer must hold ``needed`` slots: exactly the prompt at prefill
        (compression follows); then the plan's bound (``plan.bound``) plus the slot a decode step
        appends before evicting, never more than the tokens the run will append (``max_tokens``,
        when known); for an unbounded layer (FullKV, prompt-only methods) ``max_tokens``, or
        geometric growth (1.25x + 64) when it is unknown."""
        if self.plan is None:
            return needed
        bound, most = self.plan.bound, self._max_tokens
        if bound is not None and needed <= bound + 1:
            return max(bound + 1 if most is None else min(bound + 1, most), needed)
        if most is not None and needed <= most:
            # the slots held now (``needed`` includes one to append) plus the tokens still to come
            return max(needed, needed - 1 + most - self._seen)
        return needed + needed // 4 + 64

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Mask sizes for transformers' mask builders: the slots plus the incoming query."""
        return self.store.n_slots + query_length, 0

    def tokens_seen(self) -> int | torch.Tensor:
        """Tokens seen so far for a method's arithmetic: ``get_seq_length()`` in eager code, a device
        count (``[]`` int64 on the layer's device) inside a compiled step: a host integer in a compiled
        step is a graph input that changes every step, and CUDA graph trees record one graph per
        value."""
        return self._seen_device if torch.compiler.is_compiling() else self._seen

    def get_seq_length(self) -> int:
        """Tokens seen so far (prompt + appended; not the slot count), so new tokens get their true
        position."""
        return self._seen

    def get_max_length(self) -> int:
        """-1: no fixed maximum (the budget is enforced by the method, not by a static buffer)."""
        return -1
