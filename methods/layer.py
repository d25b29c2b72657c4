"""The slot storage of one decoder layer of the compressed cache (:class:`CompressedLayer`).

Keys and values are held at KV-head granularity (never repeated to query heads), with per-slot
state (``log_weight``, ``positions``, method scores). Compression is physical: every per-slot
tensor lives in a preallocated buffer whose capacity is the budget plus the one slot a decode step
appends before it evicts (uncompressed caches grow geometrically), and the layer's tensors are
views of its first ``n_slots`` slots. A decode step appends in place; :meth:`CompressedLayer.drop`
evicts by moving the last slot into the victim's place (no copy of the cache);
:meth:`CompressedLayer.gather` and :meth:`CompressedLayer.set_slots` (prefill compression,
KVMerger/KeepKV rebuilds) replace the tensors by compact ones, releasing the old buffer. Slot
order is therefore not position order: methods find tokens by ``positions``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import CacheLayerMixin

from methods.architecture import LayerSpec

if TYPE_CHECKING:
    from methods.base import CompressionMethod


def slot_index(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``index`` ``[batch, kv_heads, k]`` expanded over the trailing dims of a slot tensor ``t``."""
    extra = t.shape[3:]
    return index.view(*index.shape, *([1] * len(extra))).expand(*index.shape, *extra)


def gather_slots(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[b, h, index[b, h, j], ...]`` for a slot tensor with any trailing dims."""
    return t.gather(2, slot_index(t, index))


def _in_buffer(t: torch.Tensor, buf: torch.Tensor | None) -> bool:
    """Whether ``t`` is a view of the first slots of ``buf`` (so appending can write in place)."""
    return (
        buf is not None
        and t.data_ptr() == buf.data_ptr()
        and t.stride() == buf.stride()
        and t.shape[:2] == buf.shape[:2]
        and t.shape[3:] == buf.shape[3:]
    )


class CompressedLayer(CacheLayerMixin):
    """KV state of one decoder layer.

    Attributes
    ----------
    keys, values : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``, post-RoPE, in the model's dtype.
    log_weight : torch.Tensor
        ``[batch, kv_heads, slots]`` float32, added to the attention logits of each slot
        (0 for plain tokens; ZSMerge: ``alpha * log(w)`` with fusion count ``w``).
    positions : torch.Tensor
        ``[batch, kv_heads, slots]`` int64, the original sequence index of each slot's token;
        methods may mark slots that stand for several tokens with ``-1``.
    state : dict[str, torch.Tensor]
        Method state, each ``[batch, kv_heads, slots, *extra]`` (scores, fusion counts, ...; the
        slot axis is always dim 2). New slots are filled with the method's ``state_fill`` value.
    meta : dict[str, int]
        Method scalars shared by all heads of the layer (e.g. number of residual slots).
    aux : dict[str, torch.Tensor]
        Fixed-size per-head state that stands in for evicted tokens (LESS: ``H``
        ``[batch, kv_heads, R, head_dim]`` and ``z`` ``[batch, kv_heads, R]``); counted in
        :meth:`kv_bytes`, since it replaces cache memory.
    budget : int | None
        Slot budget resolved for the current sample (None: no compression).
    spec : LayerSpec
        What the model's architecture says of this layer (``methods.architecture``): its sliding
        window (None for full attention), logit soft-cap and rotary embedding (for methods that
        re-rotate keys: StreamingLLM).
    seen_tokens : int
        Tokens seen so far (prompt + appended); the position of the next token.
    layer_idx, num_layers : int
        This layer's index and the model's number of decoder layers (per-layer budget schedules).
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
        super().__init__()
        self.max_tokens = max_tokens
        self.layer_idx, self.num_layers = layer_idx, num_layers
        self.method = method
        self.budget = budget
        self.spec = spec if spec is not None else LayerSpec()
        self.is_sliding = self.spec.window is not None
        self.seen_tokens = 0
        self.prefilled = False
        self.log_weight: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.state: dict[str, torch.Tensor] = {}
        self.meta: dict[str, int] = {}
        self.aux: dict[str, torch.Tensor] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self._grids: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    # ------------------------------------------------------------------ transformers API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate empty tensors with the incoming dtype/device (transformers ``CacheLayerMixin``)."""
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_empty((b, h, 0, d))
        self.values = value_states.new_empty((b, h, 0, value_states.shape[-1]))
        self.log_weight = torch.zeros((b, h, 0), dtype=torch.float32, device=self.device)
        self.positions = torch.zeros((b, h, 0), dtype=torch.long, device=self.device)
        self.state = {
            name: torch.zeros((b, h, 0), dtype=torch.float32, device=self.device)
            for name in self.method.state_fill
        }
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new tokens' keys/values ``[batch, kv_heads, new, head_dim]``; return all slots."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[2]
        cap = self._capacity(self.n_slots + new)
        self.keys = self._append("keys", self.keys, key_states, cap)
        self.values = self._append("values", self.values, value_states, cap)
        self.log_weight = self._append("log_weight", self.log_weight, 0.0, cap, new)
        pos = (
            self.seen_tokens
            if new == 1
            else torch.arange(self.seen_tokens, self.seen_tokens + new, device=self.device)
        )
        self.positions = self._append("positions", self.positions, pos, cap, new)
        for name, t in self.state.items():
            self.state[name] = self._append(name, t, self.method.state_fill.get(name, 0.0), cap, new)
        self.seen_tokens += new
        return self.keys, self.values

    def _capacity(self, needed: int) -> int:
        """Slots to allocate when a buffer must grow to hold ``needed`` slots: exactly the prompt at
        prefill (compression follows); then the method's bound (``CompressionMethod.slot_bound``)
        plus the slot a decode step appends before evicting, never more than the tokens the run
        will append (``max_tokens``, when known); for an unbounded layer (FullKV, prompt-only
        methods) ``max_tokens``, or geometric growth (1.25x + 64) when it is unknown."""
        if not self.prefilled:
            return needed
        bound = self.method.slot_bound(self)
        if bound is not None and needed <= bound + 1:
            cap = bound + 1 if self.max_tokens is None else min(bound + 1, self.max_tokens)
            return max(cap, needed)
        if self.max_tokens is not None and needed <= self.max_tokens:
            return self.max_tokens
        return needed + needed // 4 + 64

    def _append(
        self, name: str, t: torch.Tensor, new: torch.Tensor | float, cap: int, count: int | None = None
    ) -> torch.Tensor:
        """Append ``new`` (a tensor ``[batch, kv_heads, k, ...]`` or a fill value for ``count``
        slots) to the slot tensor ``t`` in its buffer, re-homing ``t`` when it is not a view of the
        buffer (the method replaced it) or the buffer is full; returns the view of all slots."""
        n = t.shape[2]
        k = count if count is not None else new.shape[2]
        buf = self._buffers.get(name)
        if not _in_buffer(t, buf) or n + k > buf.shape[2]:
            buf = t.new_empty((*t.shape[:2], max(cap, n + k), *t.shape[3:]))
            buf[:, :, :n] = t
            self._buffers[name] = buf
        buf[:, :, n : n + k] = new
        return buf[:, :, : n + k]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Mask sizes for transformers' mask builders: the slots plus the incoming query."""
        return self.n_slots + query_length, 0

    def get_seq_length(self) -> int:
        """Tokens seen so far (not the slot count), so new tokens get their true position."""
        return self.seen_tokens

    def get_max_length(self) -> int:
        """-1: no fixed maximum (the budget is enforced by the method, not by a static buffer)."""
        return -1

    # ------------------------------------------------------------------ seam helpers
    @property
    def n_slots(self) -> int:
        """Number of slots currently held per KV head."""
        return 0 if self.keys is None else self.keys.shape[-2]

    def gather(self, index: torch.Tensor) -> None:
        """Keep the slots ``index`` ``[batch, kv_heads, kept]`` (per-head selection), freeing the rest."""
        idx_d = index.unsqueeze(-1).expand(-1, -1, -1, self.keys.shape[-1])
        self.keys = self.keys.gather(2, idx_d)
        self.values = self.values.gather(2, index.unsqueeze(-1).expand(-1, -1, -1, self.values.shape[-1]))
        self.log_weight = self.log_weight.gather(2, index)
        self.positions = self.positions.gather(2, index)
        self.state = {name: gather_slots(t, index) for name, t in self.state.items()}
        self._buffers.clear()  # the old buffers (the uncompressed prompt) are released now

    def _slot_tensors(self) -> dict[str, torch.Tensor]:
        return {
            "keys": self.keys,
            "values": self.values,
            "log_weight": self.log_weight,
            "positions": self.positions,
        } | self.state

    def drop(self, slot: torch.Tensor) -> None:
        """Evict one slot per head, ``slot`` ``[batch, kv_heads]`` (int64), in place: the last slot
        moves into its place and the layer holds one slot fewer (O(1) per head, no copy of the
        cache; slot order changes, positions go with their slots)."""
        last = self.n_slots - 1
        b, h = slot.shape
        grid = self._grids.get((b, h))
        if grid is None:
            grid = self._grids[(b, h)] = (
                torch.arange(b, device=slot.device)[:, None].expand(b, h),
                torch.arange(h, device=slot.device)[None, :].expand(b, h),
            )
        bi, hi = grid
        for t in (self.keys, self.values, self.log_weight, self.positions, *self.state.values()):
            t[bi, hi, slot] = t[:, :, last].clone()  # a copy: the victim may be the last slot itself
        self.keys, self.values = self.keys[:, :, :last], self.values[:, :, :last]
        self.log_weight, self.positions = self.log_weight[:, :, :last], self.positions[:, :, :last]
        self.state = {name: t[:, :, :last] for name, t in self.state.items()}

    def swap(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Exchange slots ``a`` and ``b`` ``[batch, kv_heads]`` (int64) of every head, in place."""
        ia, ib = a.unsqueeze(-1), b.unsqueeze(-1)
        for t in self._slot_tensors().values():
            xa, xb = gather_slots(t, ia), gather_slots(t, ib)
            t.scatter_(2, slot_index(t, ia), xb)
            t.scatter_(2, slot_index(t, ib), xa)

    def set_slots(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        log_weight: torch.Tensor,
        positions: torch.Tensor,
        state: dict[str, torch.Tensor],
    ) -> None:
        """Replace every slot tensor at once (shapes as in the class docstring)."""
        self.keys, self.values, self.log_weight, self.positions = keys, values, log_weight, positions
        self.state = state
        self._buffers.clear()

    @property
    def window(self) -> int | None:
        """The layer's sliding window (tokens a query attends to, itself included), or None."""
        return self.spec.window

    @property
    def softcap(self) -> float | None:
        """The attention-logit soft-cap of the layer (Gemma-2), or None."""
        return self.spec.softcap

    def fullkv_tokens(self) -> int:
        """Tokens the model's own (uncompressed) cache would hold now: all seen tokens, or on a
        sliding layer the last ``window - 1`` (transformers' ``DynamicSlidingWindowLayer``)."""
        return self.seen_tokens if self.window is None else min(self.seen_tokens, self.window - 1)

    def real_slots(self) -> float:
        """Mean over heads of the slots that can be attended (``log_weight > -inf``; padding excluded)."""
        if self.log_weight is None:
            return 0.0
        return float(torch.isfinite(self.log_weight).sum(dim=-1).float().mean())

    def kv_bytes(self) -> int:
        """Bytes of the held keys and values (slots x kv_heads x head_dim x 2 x dtype size x batch),
        plus the ``aux`` state that stands in for evicted tokens: exact, from the slot count."""
        if self.keys is None:
            return 0
        tensors = [self.keys, self.values, *self.aux.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def state_bytes(self) -> int:
        """Bytes of log_weight, positions and method state of the held slots (the method's overhead)."""
        if self.keys is None:
            return 0
        tensors = [self.log_weight, self.positions, *self.state.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def allocated_bytes(self) -> int:
        """Bytes of the storage behind every slot tensor and ``aux`` (capacity included): what the
        layer really occupies; at most one slot more than the budget for a compressing method."""
        if self.keys is None:
            return 0
        tensors = [*self._slot_tensors().values(), *self.aux.values()]
        return sum(t.untyped_storage().nbytes() for t in tensors)
