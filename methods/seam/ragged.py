"""Ragged heads: a storage kind (:class:`~methods.seam.storage.SlotStorage`) whose KV heads each hold
their own number of slots, packed in one buffer.

A head-adaptive allocator (AdaKV, DuoAttention's head types) keeps a different number of tokens in
every (batch, KV head) *segment*; it swaps the layer's uniform store for one of these
(``layer.store = layer.store.ragged(keep, bounds)``). :class:`RaggedStore` holds them packed: field
buffers ``[total capacity, *extra]`` where segment ``s`` (``s = b * kv_heads + h``) owns the range
``offsets[s] .. offsets[s] + capacity[s]``, its first ``lengths[s]`` slots valid. Capacity is what the
allocator kept plus the tokens the segment may still receive (a bounded segment: the one slot a decode
step appends before it evicts; an unbounded one: the run's remaining tokens), so the memory held is
the sum over heads of their slots, never ``heads x max``.

Decode attention over it is ``kernels.ragged_decode`` (segment-wise softmax; per-segment lengths on
the Triton kernel). Keys and values are held by the uniform store's codec, handed on
(``methods.seam.storage``): as themselves, or as its code fields packed like any other (decoded for
views and attention, encoded when written). Views are padded to the longest head (``positions`` -1,
``log_weight`` ``-inf`` and zeros on padding). A bounded segment is evicted back to its bound after
each append (the method's ``drop``); the longest head's count is then known on the host, with no
synchronisation per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels.ragged_decode import ragged_decode_attention
from methods.seam.ragged_pack import pack_kept, regrow
from methods.seam.storage import KV, PLAIN, Codec, SlotStorage

if TYPE_CHECKING:
    from methods.seam.traits import Traits

#: Fields a ragged layer keeps (method state is not carried: ragged layers are written by allocators
#: that rank once, at prefill, or by position); a codec holds its fields for keys and values.
FIELDS = ("keys", "values", "positions")
#: Slots of room added at least when a growing segment runs out (run length unknown).
GROWTH = 64


class RaggedStore(SlotStorage):
    """Packed per-head slot buffers of one layer (module docstring).

    Attributes
    ----------
    buffers : dict[str, torch.Tensor]
        ``keys`` ``[total, head_dim]``, ``values`` ``[total, head_dim_v]`` (model dtype),
        ``positions`` ``[total]`` int64 (token index of each slot; -1 on never-written slots).
    offsets, capacity : torch.Tensor
        ``[segments]`` int64: where each segment starts and how many slots it may hold.
    lengths : torch.Tensor
        ``[segments]`` int64 valid slots per segment (device tensor, updated in place).
    segment : torch.Tensor
        ``[total]`` int64 segment of every buffer slot.
    local : torch.Tensor
        ``[total]`` int64 index of every buffer slot inside its segment.
    shape : tuple[int, int]
        ``(batch, kv_heads)``: segment ``s`` is ``divmod(s, kv_heads)``.
    grows : torch.Tensor
        ``[segments]`` bool: segments that keep every appended token (the others evict back to
        their bound after each append).
    bounds : torch.Tensor
        ``[segments]`` int64 bound of each evicting segment (-1 for a growing one).
    room : int
        Appends the growing segments can still take before the buffers must grow (host counter:
        no synchronisation per step).
    codec : Codec
        How keys and values are held (the uniform store's).
    token : int
        Key + value bytes of one token in the model's dtype over the batch and every KV head.
    dtype : torch.dtype | None
        The model's dtype, in which keys and values held as codes are read.
    kv_fields : tuple[str, ...]
        The buffers counted as key/value bytes (all but ``positions``).
    """

    kind = "ragged"

    def __init__(
        self,
        buffers: dict[str, torch.Tensor],
        offsets: torch.Tensor,
        capacity: torch.Tensor,
        lengths: torch.Tensor,
        shape: tuple[int, int],
        bounds: torch.Tensor,
        room: int,
        codec: Codec = PLAIN,
        token: int = 0,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.buffers, self.offsets, self.capacity, self.lengths = buffers, offsets, capacity, lengths
        self.shape, self.bounds, self.room, self.codec, self.token = shape, bounds, room, codec, token
        self.kv_fields = tuple(name for name in buffers if name != "positions")
        self.dtype = dtype
        self.grows = bounds < 0
        self._index()
        # host copy of (kept, bound) per segment and the appends since: the longest head without a sync
        self._segments = list(zip(lengths.tolist(), bounds.tolist(), strict=True))
        self._appended, self._ahead = 0, 0

    def _index(self) -> None:
        """``segment`` and ``local`` of every buffer slot, from ``offsets`` and ``capacity``."""
        offsets, total = self.offsets, self.buffers["positions"].shape[0]
        segments = torch.arange(len(offsets), device=offsets.device)
        self.segment = torch.repeat_interleave(segments, self.capacity, output_size=total)
        self.local = torch.arange(total, device=offsets.device) - offsets.index_select(0, self.segment)

    @classmethod
    def from_mask(
        cls,
        fields: dict[str, torch.Tensor],
        keep: torch.Tensor,
        room: int,
        bounds: torch.Tensor | None = None,
        **kind: object,
    ) -> RaggedStore:
        """The slots ``keep`` selects, per head, in slot order (``ragged_pack.pack_kept``: arguments,
        errors); ``kind``: what the class takes besides (``codec``, ``token``, ``dtype``)."""
        buffers, offsets, capacity, counts, bounds = pack_kept(fields, keep, room, bounds)
        return cls(buffers, offsets, capacity, counts, tuple(keep.shape[:2]), bounds, room, **kind)

    # ------------------------------------------------------------------ reading
    @property
    def n_slots(self) -> int:
        """Slots of the longest head (host arithmetic: bounded heads stay at their bound)."""
        grown = self._appended
        return max(c + grown if b < 0 else max(c, min(b, c + grown)) for c, b in self._segments)

    def valid(self) -> torch.Tensor:
        """``[total]`` bool: whether each buffer slot holds a token."""
        return self.local < self.lengths.index_select(0, self.segment)

    def _padded(self, flat: torch.Tensor, fill: float) -> torch.Tensor:
        """A packed ``[total, *extra]`` tensor as ``[batch, kv_heads, n_slots, *extra]``, ``fill`` on
        padding."""
        n = self.n_slots
        col = torch.arange(n, device=flat.device)
        index = (self.offsets.unsqueeze(-1) + col).clamp_(max=flat.shape[0] - 1)
        out = flat[index]
        pad = (col >= self.lengths.unsqueeze(-1)).view(*index.shape, *([1] * (flat.dim() - 1)))
        return out.masked_fill_(pad, fill).view(*self.shape, n, *flat.shape[1:])

    def view(self, name: str) -> torch.Tensor:
        """Field ``name`` padded to the longest head (module docstring); ``log_weight`` is 0 on the
        held slots.

        Raises
        ------
        KeyError
            For a field other than keys, values, positions and log_weight.
        """
        if name == "log_weight":
            return self._padded(torch.zeros(len(self.segment), device=self.offsets.device), float("-inf"))
        return self._padded(self._packed(name), -1 if name == "positions" else 0)

    def _packed(self, name: str) -> torch.Tensor:
        """Field ``name`` over the whole buffer ``[total, *extra]`` (keys or values held as codes:
        decoded)."""
        if name in self.buffers:
            return self.buffers[name]
        if name in KV:
            return self.codec.decode(name, self.buffers).to(self.dtype)
        raise KeyError(f"a ragged store holds {FIELDS} and log_weight, not {name!r}")

    def state_names(self) -> tuple[str, ...]:
        """None: method state is not carried into ragged heads."""
        return ()

    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]`` int64 valid slots of every head."""
        return self.lengths.view(self.shape)

    def allocated_bytes(self) -> int:
        """Bytes of every buffer (capacity included) and of the index tensors."""
        index = (self.offsets, self.capacity, self.lengths, self.segment, self.local)
        tensors = [*self.buffers.values(), *index]
        return sum(t.untyped_storage().nbytes() for t in tensors)

    def kv_bytes(self) -> int:
        """Bytes of the valid keys and values: the sum over heads of their slots."""
        return int(self.lengths.sum()) * self._slot_bytes()

    def state_bytes(self) -> int:
        """Bytes of the valid slots' positions and of the per-segment index tensors."""
        index = (self.offsets, self.capacity, self.lengths)
        return int(self.lengths.sum()) * self.buffers["positions"].element_size() + sum(
            t.numel() * t.element_size() for t in index
        )

    def token_bytes(self) -> int:
        """Key + value bytes of one token in the model's dtype over the batch and every KV head."""
        return self.token

    def _slot_bytes(self) -> int:
        return sum(self.buffers[f][0].nbytes for f in self.kv_fields)

    # ------------------------------------------------------------------ operations
    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Append one token to every segment: ``keys``/``values`` ``[batch, kv_heads, 1, head_dim]``
        at ``positions`` ``[1]``. A bounded segment evicts after each append (its spare slot); the
        growing ones take one slot of their room, and all buffers grow (by :data:`GROWTH` or a
        quarter) when it is used up (only when the run's length was not known).

        Raises
        ------
        ValueError
            For more than one token.
        """
        at = self._reserve(keys)
        for name, x in zip(KV, (keys, values), strict=True):
            for field, rows in self.codec.encode(name, x.reshape(-1, x.shape[-1])).items():
                self.buffers[field].index_copy_(0, at, rows)
        self.buffers["positions"].index_copy_(0, at, positions.expand(len(at)))
        self.lengths.add_(1)

    def _reserve(self, keys: torch.Tensor) -> torch.Tensor:
        """The buffer slot ``[segments]`` of each segment's next token (``keys`` ``[batch, kv_heads,
        1, head_dim]``), one slot of room taken (the buffers grown when it is used up) and the append
        counted, unless :meth:`count_ahead` did both.

        Raises
        ------
        ValueError
            For more than one token.
        """
        if keys.shape[2] != 1:
            raise ValueError("ragged heads take one token per decode step")
        if self._ahead:
            self._ahead = 0
        else:
            self.make_room(1)
            self.room, self._appended = self.room - 1, self._appended + 1
        return self.offsets + self.lengths

    def count_ahead(self, k: int, grows: bool) -> None:
        """Take the room of the next append of ``k`` tokens and count it now (``SlotStorage.count_ahead``;
        every ragged layer: ``room`` changes at every append, bounded segments or not)."""
        self.room, self._appended, self._ahead = self.room - k, self._appended + k, k

    def make_room(self, k: int) -> None:
        """Grow the buffers now if the growing segments have less than ``k`` appends of room
        (``SlotStorage.make_room``)."""
        if self.room < k:
            self._grow(max(GROWTH, k, int(self.capacity.max()) // 4))

    def tensors(self) -> list[torch.Tensor]:
        """The buffers and the index tensors (``lengths`` grows in place at every append)."""
        return [*self.buffers.values(), self.offsets, self.capacity, self.lengths, self.segment, self.local]

    def _grow(self, more: int) -> None:
        """Give every growing segment ``more`` slots of room (new buffers, the valid slots copied)."""
        self.buffers, self.offsets, self.capacity = regrow(
            self.buffers, self.capacity, self.grows, self.segment, self.local, self.valid(), more
        )
        self.room += more
        self._index()

    def write(self, name: str, value: torch.Tensor) -> None:
        """Set ``keys`` or ``values`` of the held slots to ``value`` ``[batch, kv_heads, n_slots,
        head_dim]`` (padded as the views; padding is not read), in place (key re-rotation); a field
        whose trailing shape changes (ThinK's kept channels) gets a new buffer."""
        valid = self.valid()
        rows = value.reshape(-1, value.shape[-1])[(self.segment * self.n_slots + self.local)[valid]]
        for field, t in self.codec.encode(name, rows).items():
            if self.buffers[field].shape[1:] != t.shape[1:]:  # a codec of another width (ThinK)
                self.buffers[field] = t.new_zeros((len(valid), *t.shape[1:]))
            self.buffers[field][valid] = t.to(self.buffers[field].dtype)

    def keep(self, index: torch.Tensor) -> None:
        """Not offered: ragged heads are selected once, when the store is made.

        Raises
        ------
        NotImplementedError
            Always.
        """
        raise NotImplementedError("a ragged store keeps what it was made with; drop slots instead")

    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> RaggedStore:
        """Not offered: the heads are ragged already.

        Raises
        ------
        NotImplementedError
            Always.
        """
        raise NotImplementedError("the heads are ragged already")

    def drop(self, slot: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """Evict slot ``slot`` ``[batch, kv_heads]`` (index inside each head) in the heads where
        ``active`` ``[batch, kv_heads]`` (bool; default: every head): the head's last valid slot moves
        into its place. Inactive heads copy their last slot onto itself (a no-op), so shapes never
        depend on the data. Only bounded heads are to be dropped from (module docstring)."""
        active = torch.ones_like(self.lengths, dtype=torch.bool) if active is None else active.reshape(-1)
        last = self.offsets + self.lengths - 1
        target = torch.where(active, self.offsets + slot.reshape(-1), last)
        for buf in self.buffers.values():
            buf.index_copy_(0, target, buf.index_select(0, last))
        self.lengths.sub_(active.long())

    # ------------------------------------------------------------------ attention
    def attend(
        self, query: torch.Tensor, scaling: float, traits: Traits, softcap: float | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode attention of each query group over its own head's slots
        (``kernels.ragged_decode``); probabilities padded as the views, when the traits ask for them.

        Raises
        ------
        NotImplementedError
            For logits or a fused score update (not offered over ragged heads).
        """
        needs = traits.needs
        if needs == "logits" or (needs == "probs" and traits.score_decay is not None):
            raise NotImplementedError("ragged heads hand a decode step probabilities or nothing")
        b, hq, _, d = query.shape
        h = self.shape[1]
        out, probs = ragged_decode_attention(
            query.reshape(b * h, hq // h, d),
            self._packed("keys"),
            self._packed("values"),
            self.offsets,
            self.lengths,
            self.segment,
            None,  # the valid slots, derived only where the path reads them
            None,
            scaling,
            softcap,
            return_probs=needs == "probs",
        )
        return out.reshape(b, hq, 1, -1), None if probs is None else self._padded(probs, 0.0)
