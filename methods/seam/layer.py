"""One decoder layer of the compressed cache (:class:`CompressedLayer`): the transformers cache-layer
API over a :class:`~methods.seam.store.SlotStore`.

Keys and values are held at KV-head granularity (never repeated to query heads), with per-slot
state (``log_weight``, ``positions``, method scores). Compression is physical: the store's buffers
hold the bound of the layer's plan (``layer.plan``, :class:`~methods.seam.plan.LayerPlan`, made
once by the layer's rule when the prompt arrives) plus the one slot a decode step appends before it
evicts; uncompressed layers are sized for the run's tokens (or grow geometrically). The layer's
tensors are read-only views of the store's valid slots; methods change them only through the
store's operations (``layer.store``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import CacheLayerMixin

from methods.seam.architecture import LayerSpec
from methods.seam.plan import LayerPlan
from methods.seam.ragged import RaggedStore
from methods.seam.store import SlotStore, StateView, gather_slots, slot_index

if TYPE_CHECKING:
    from methods.seam.contract import CompressionMethod

__all__ = ["CompressedLayer", "gather_slots", "slot_index"]


class CompressedLayer(CacheLayerMixin):
    """KV state of one decoder layer.

    The attributes below are what a method uses (docs/extending.md); with ``n_slots`` and
    ``device`` they are all it needs. The rest (``update``, ``prefilled``, the byte counts,
    transformers' cache-layer API) belongs to the seam.

    Attributes
    ----------
    store : SlotStore
        The slot buffers and the only operations that change them (``methods.seam.store``).
    keys, values : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``, post-RoPE, in the model's dtype (read-only views of
        the store's valid slots, as are the next three).
    log_weight : torch.Tensor
        ``[batch, kv_heads, slots]`` float32, added to the attention logits of each slot
        (0 for plain tokens; ZSMerge: ``alpha * log(w)`` with fusion count ``w``).
    positions : torch.Tensor
        ``[batch, kv_heads, slots]`` int64, the original sequence index of each slot's token;
        methods may mark slots that stand for several tokens with ``-1``.
    state : Mapping[str, torch.Tensor]
        Method state (a read-only mapping), each ``[batch, kv_heads, slots, *extra]`` (scores,
        fusion counts, ...; the slot axis is always dim 2). New slots are filled with the method's
        ``state_fill`` value.
    plan : LayerPlan | None
        The method's budget arithmetic for this layer and sample (``methods.seam.plan``): set by
        :meth:`update` when the prompt arrives (None before).
    scalars : dict[str, torch.Tensor | int]
        Method numbers of the layer that change during a sample: event counters (those named in
        ``CompressionMethod.counters`` are summed into the run record; KeepKV keeps them per head),
        ZSMerge's residual-slot count, KeepKV's EMA constants; device tensors stay on the device
        (no host synchronisation per step).
    ragged : RaggedStore | None
        Set when a head-adaptive allocator gave the layer's heads different slot counts
        (:meth:`make_ragged`; ``methods.seam.ragged``): the slots then live there, packed, and the
        uniform views above are None.
    aux : dict[str, torch.Tensor]
        Fixed-size per-head state that stands in for evicted tokens (LESS: ``H``
        ``[batch, kv_heads, R, head_dim]`` and ``z`` ``[batch, kv_heads, R]``); counted in
        :meth:`kv_bytes`, since it replaces cache memory.
    budget : int | None
        Slot budget resolved for the current sample (None: no compression).
    spec : LayerSpec
        What the model's architecture says of this layer (``methods.seam.architecture``): its sliding
        window (None for full attention), logit soft-cap and rotary embedding (for methods that
        re-rotate keys: StreamingLLM).
    seen_tokens : int
        Tokens seen so far (prompt + appended); the position of the next token.
    layer_idx, num_layers : int
        This layer's index and the model's number of decoder layers (per-layer budget schedules).
    method : CompressionMethod
        The layer's rule (the seam's): the run's method, or the sliding-window rule on a sliding
        layer.

    Parameters
    ----------
    method, budget, spec, layer_idx, num_layers
        As the attributes.
    max_tokens : int | None
        Tokens the run will append at most (prompt + new tokens - 1), when known: no buffer is
        ever larger (a budget above the prompt allocates nothing it cannot use).
    """

    def __init__(
        self,
        method: CompressionMethod,
        budget: int | None,
        spec: LayerSpec | None = None,
        layer_idx: int = 0,
        num_layers: int = 1,
        max_tokens: int | None = None,
    ) -> None:
        self.is_initialized = False  # no CacheLayerMixin.__init__: its keys/values are store views here
        self._max_tokens = max_tokens
        self.layer_idx, self.num_layers = layer_idx, num_layers
        self.method = method
        self.budget = budget
        self.spec = spec if spec is not None else LayerSpec()
        self.is_sliding = self.spec.window is not None
        self.seen_tokens = 0
        self.prefilled = False
        owner = weakref.ref(self)  # no layer <-> store cycle: the cache is freed by reference counting
        self.store = SlotStore(method.state_fill, lambda needed: owner()._capacity(needed))
        self._state = StateView(self.store, tuple(method.state_fill))
        self.plan: LayerPlan | None = None
        self.scalars: dict[str, torch.Tensor | int] = {}
        self.aux: dict[str, torch.Tensor] = {}
        self.ragged: RaggedStore | None = None
        self._segments: list[tuple[int, int]] = []  # ragged: (kept at prefill, bound or -1) per head
        self._appended = 0  # ragged: tokens appended since the heads became ragged

    # ------------------------------------------------------------------ read-only views of the store
    @property
    def keys(self) -> torch.Tensor | None:
        """``[batch, kv_heads, slots, head_dim]`` post-RoPE keys (None before the first update)."""
        return self.store.view("keys") if self.store.buffers else None

    @property
    def values(self) -> torch.Tensor | None:
        """``[batch, kv_heads, slots, head_dim]`` values (None before the first update)."""
        return self.store.view("values") if self.store.buffers else None

    @property
    def log_weight(self) -> torch.Tensor | None:
        """``[batch, kv_heads, slots]`` float32 attention-logit bias of each slot."""
        return self.store.view("log_weight") if self.store.buffers else None

    @property
    def positions(self) -> torch.Tensor | None:
        """``[batch, kv_heads, slots]`` int64 token index of each slot (-1: a merged slot)."""
        return self.store.view("positions") if self.store.buffers else None

    @property
    def state(self) -> StateView:
        """The method's per-slot state, read-only: name -> ``[batch, kv_heads, slots, *extra]``."""
        return self._state

    # ------------------------------------------------------------------ transformers API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Record the incoming dtype/device (transformers ``CacheLayerMixin``); the store allocates
        its buffers on the first append."""
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new tokens' keys/values ``[batch, kv_heads, new, head_dim]``; return all slots. A
        chunk (several tokens on a prefilled layer) is returned as it came, unappended: the attention
        appends it token by token (``methods.seam.step.chunk_step``)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[2]
        if self.prefilled and new > 1:
            return key_states, value_states
        if self.ragged is not None:  # heads of different lengths: the attention reads the packed store
            if new != 1:
                raise NotImplementedError("a ragged layer takes one token per decode step")
            self.ragged.append(key_states, value_states, self.seen_tokens)
            self.seen_tokens += 1
            self._appended += 1
            return key_states, value_states
        positions = torch.arange(self.seen_tokens, self.seen_tokens + new, device=key_states.device)
        self.store.append(key_states, value_states, positions)
        self.seen_tokens += new
        if self.plan is None:  # the prompt: the rule plans the layer once, for this sample
            self.plan = self.method.plan(self)
        return self.keys, self.values

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
            return max(needed, needed - 1 + most - self.seen_tokens)
        return needed + needed // 4 + 64

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Mask sizes for transformers' mask builders: the slots plus the incoming query."""
        return self.n_slots + query_length, 0

    def get_seq_length(self) -> int:
        """Tokens seen so far (not the slot count), so new tokens get their true position."""
        return self.seen_tokens

    def get_max_length(self) -> int:
        """-1: no fixed maximum (the budget is enforced by the method, not by a static buffer)."""
        return -1

    # ------------------------------------------------------------------ ragged heads
    def make_ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> None:
        """Keep a different number of slots in every head: the slots ``keep`` ``[batch, kv_heads,
        slots]`` (bool) selects move into a :class:`~methods.seam.ragged.RaggedStore` sized for them
        plus what each head may still receive: the run's remaining tokens for a head that keeps
        what it receives, or up to its bound plus one slot for a head with a bound (``bounds``
        ``[batch, kv_heads]`` int64, -1: no bound; default: no head has one; such a head evicts
        after each append). The uniform buffers are released; method state is not carried over.

        Raises
        ------
        ValueError
            If a head keeps nothing.
        """
        most = self._max_tokens
        room = max(0, most - self.seen_tokens) if most is not None else 0
        fields = {name: self.store.view(name) for name in ("keys", "values", "positions")}
        self.ragged = RaggedStore.from_mask(fields, keep, room, bounds)
        # host copy of (kept, bound) per head: n_slots without a synchronisation per step
        self._segments = list(zip(self.ragged.lengths.tolist(), self.ragged.bounds.tolist(), strict=True))
        self._appended = 0
        self.store.buffers, self.store.n = {}, 0

    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]`` int64 slots held by every head (all equal unless ragged)."""
        if self.ragged is not None:
            return self.ragged.head_slots()
        b, h = self.keys.shape[:2] if self.keys is not None else (1, 1)
        return torch.full((b, h), self.n_slots, dtype=torch.long)

    # ------------------------------------------------------------------ seam helpers
    @property
    def n_slots(self) -> int:
        """Number of slots currently held per KV head (ragged heads: the longest head's)."""
        if self.ragged is not None:
            grown = self._appended
            return max(c + grown if b < 0 else max(c, min(b, c + grown)) for c, b in self._segments)
        return self.store.n

    @property
    def softcap(self) -> float | None:
        """The attention-logit soft-cap of the layer (Gemma-2), or None."""
        return self.spec.softcap

    def fullkv_tokens(self) -> int:
        """Tokens the model's own (uncompressed) cache would hold now: all seen tokens, or on a
        sliding layer the last ``window - 1`` (transformers' ``DynamicSlidingWindowLayer``)."""
        window = self.spec.window
        return self.seen_tokens if window is None else min(self.seen_tokens, window - 1)

    def real_slots(self) -> float:
        """Mean over heads of the slots that can be attended (``log_weight > -inf``; padding excluded)."""
        if self.ragged is not None:
            return float(self.ragged.lengths.float().mean())
        if self.log_weight is None:
            return 0.0
        return float(torch.isfinite(self.log_weight).sum(dim=-1).float().mean())

    def token_bytes(self) -> int:
        """Key+value bytes one token occupies in this layer over the batch and every KV head."""
        if self.ragged is not None:
            (b, h), bufs = self.ragged.shape, self.ragged.buffers
            k, v = bufs["keys"], bufs["values"]
        elif self.keys is not None:
            (b, h), k, v = self.keys.shape[:2], self.keys, self.values
        else:
            return 0
        return b * h * (k.shape[-1] + v.shape[-1]) * k.element_size()

    def kv_bytes(self) -> int:
        """Bytes of the held keys and values (slots x kv_heads x head_dim x 2 x dtype size x batch),
        plus the ``aux`` state that stands in for evicted tokens: exact, from the slot count (ragged
        heads: the sum over heads of their slots)."""
        if self.ragged is not None:
            return self.ragged.kv_bytes() + sum(t.numel() * t.element_size() for t in self.aux.values())
        if self.keys is None:
            return 0
        tensors = [self.keys, self.values, *self.aux.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def state_bytes(self) -> int:
        """Bytes of log_weight, positions and method state of the held slots (the method's overhead;
        ragged heads: positions and the per-segment index tensors)."""
        if self.ragged is not None:
            r = self.ragged
            return int(r.lengths.sum()) * r.buffers["positions"].element_size() + sum(
                t.numel() * t.element_size() for t in (r.offsets, r.capacity, r.lengths)
            )
        if self.keys is None:
            return 0
        tensors = [self.log_weight, self.positions, *self.state.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def allocated_bytes(self) -> int:
        """Bytes of the storage behind every slot tensor and ``aux`` (capacity included): what the
        layer really occupies; at most one slot more than the budget for a compressing method."""
        held = self.ragged if self.ragged is not None else self.store
        return held.allocated_bytes() + sum(t.untyped_storage().nbytes() for t in self.aux.values())
