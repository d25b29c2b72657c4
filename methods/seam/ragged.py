"""Ragged heads: a layer whose KV heads each hold their own number of slots, packed in one buffer.

A head-adaptive allocator (AdaKV, DuoAttention's head types) keeps a different number of tokens in
every (batch, KV head) *segment*. :class:`RaggedStore` holds them packed: field buffers
``[total capacity, *extra]`` where segment ``s`` (``s = b * kv_heads + h``) owns the range
``offsets[s] .. offsets[s] + capacity[s]``, its first ``lengths[s]`` slots valid. Capacity is what the
allocator kept plus the tokens the segment may still receive (a bounded segment: the one slot a decode
step appends before it evicts; an unbounded one: the run's remaining tokens), so the memory held is
the sum over heads of their slots, never ``heads x max``.

Decode attention over it is ``kernels.ragged_decode`` (segment-wise softmax; per-segment lengths on
the Triton kernel). Operations: :meth:`RaggedStore.from_mask` (built once, at prefill, from a
per-head selection of a uniform layer), :meth:`~RaggedStore.append` (one token per segment),
:meth:`~RaggedStore.drop` (evict one slot in chosen segments: the segment's last valid slot moves
into its place, no host synchronisation) and :meth:`~RaggedStore.oldest` (the victim of a
sinks + recent window rule).
"""

from __future__ import annotations

import torch

#: Fields a ragged layer keeps (method state is not carried: ragged layers are written by allocators
#: that rank once, at prefill, or by position).
FIELDS = ("keys", "values", "positions")
#: Slots of room added at least when a growing segment runs out (run length unknown).
GROWTH = 64


class RaggedStore:
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
    """

    def __init__(
        self,
        buffers: dict[str, torch.Tensor],
        offsets: torch.Tensor,
        capacity: torch.Tensor,
        lengths: torch.Tensor,
        shape: tuple[int, int],
        bounds: torch.Tensor,
        room: int,
    ) -> None:
        self.buffers, self.offsets, self.capacity, self.lengths = buffers, offsets, capacity, lengths
        self.shape, self.bounds, self.room = shape, bounds, room
        self.grows = bounds < 0
        total = buffers["keys"].shape[0]
        self.segment = torch.repeat_interleave(
            torch.arange(len(offsets), device=offsets.device), capacity, output_size=total
        )
        self.local = torch.arange(total, device=offsets.device) - offsets.index_select(0, self.segment)

    @classmethod
    def from_mask(
        cls,
        fields: dict[str, torch.Tensor],
        keep: torch.Tensor,
        room: int,
        bounds: torch.Tensor | None = None,
    ) -> RaggedStore:
        """Pack the slots ``keep`` selects, per head, in slot order.

        Parameters
        ----------
        fields : dict[str, torch.Tensor]
            ``keys``/``values`` ``[batch, kv_heads, n, head_dim]`` and ``positions``
            ``[batch, kv_heads, n]`` of the uniform layer.
        keep : torch.Tensor
            ``[batch, kv_heads, n]`` bool: the slots each head keeps (at least one per head).
        room : int
            Tokens a growing segment may still receive (the run's remaining tokens, when known).
        bounds : torch.Tensor | None
            ``[batch, kv_heads]`` int64: a segment's bound (it evicts back to it after each append
            and holds ``max(kept, bound) + 1`` slots), or -1 for a segment that keeps what it
            receives (default: every segment grows).

        Raises
        ------
        ValueError
            If a head keeps nothing.
        """
        b, h, n = keep.shape
        counts = keep.sum(-1).reshape(-1)
        if bool((counts == 0).any()):
            raise ValueError("every KV head must keep at least one slot")
        bounds = torch.full_like(counts, -1) if bounds is None else bounds.reshape(-1).to(counts.device)
        grows = bounds < 0
        capacity = torch.where(grows, counts + room, torch.maximum(bounds, counts) + 1)
        offsets = torch.cumsum(capacity, 0) - capacity
        total = int(capacity.sum())  # the one host synchronisation, at prefill
        flat = keep.reshape(b * h, n)
        rank = torch.cumsum(flat, -1) - 1  # index of each kept slot inside its segment
        dest = (offsets.unsqueeze(-1) + rank)[flat]  # packed index of every kept slot, segment order
        buffers = {}
        for name in FIELDS:
            src = fields[name].reshape(b * h, n, *fields[name].shape[3:])
            fill = -1 if name == "positions" else 0
            buf = src.new_full((total, *src.shape[2:]), fill)
            buf[dest] = src[flat]
            buffers[name] = buf
        return cls(buffers, offsets, capacity, counts.clone(), (b, h), bounds, room)

    # ------------------------------------------------------------------ reading
    def valid(self) -> torch.Tensor:
        """``[total]`` bool: whether each buffer slot holds a token."""
        return self.local < self.lengths.index_select(0, self.segment)

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
        k, v = self.buffers["keys"], self.buffers["values"]
        per_slot = k.shape[-1] * k.element_size() + v.shape[-1] * v.element_size()
        return int(self.lengths.sum()) * per_slot

    # ------------------------------------------------------------------ operations
    def append(self, keys: torch.Tensor, values: torch.Tensor, position: int) -> None:
        """Append one token to every segment: ``keys``/``values`` ``[batch, kv_heads, 1, head_dim]``
        at position ``position``. A bounded segment evicts after each append (its spare slot); the
        growing ones take one slot of their room, and all buffers grow (by :data:`GROWTH` or a
        quarter) when it is used up (only when the run's length was not known)."""
        if self.room < 1:
            self._grow(max(GROWTH, int(self.capacity.max()) // 4))
        self.room -= 1
        at = self.offsets + self.lengths
        self.buffers["keys"].index_copy_(0, at, keys.reshape(-1, keys.shape[-1]))
        self.buffers["values"].index_copy_(0, at, values.reshape(-1, values.shape[-1]))
        self.buffers["positions"].index_fill_(0, at, position)
        self.lengths.add_(1)

    def _grow(self, more: int) -> None:
        """Give every growing segment ``more`` slots of room (new buffers, the valid slots copied)."""
        capacity = self.capacity + torch.where(self.grows, more, 0)
        offsets = torch.cumsum(capacity, 0) - capacity
        total = int(capacity.sum())
        valid = self.valid()
        dest = offsets.index_select(0, self.segment) + self.local
        for name, buf in self.buffers.items():
            new = buf.new_full((total, *buf.shape[1:]), -1 if name == "positions" else 0)
            new[dest[valid]] = buf[valid]
            self.buffers[name] = new
        self.__init__(
            self.buffers, offsets, capacity, self.lengths, self.shape, self.bounds, self.room + more
        )

    def drop(self, victim: torch.Tensor, active: torch.Tensor) -> None:
        """Evict slot ``victim`` ``[segments]`` (packed index) in the segments where ``active``
        ``[segments]`` (bool): the segment's last valid slot moves into its place. Inactive
        segments copy their last slot onto itself (a no-op), so shapes never depend on the data."""
        last = self.offsets + self.lengths - 1
        target = torch.where(active, victim, last)
        for buf in self.buffers.values():
            buf.index_copy_(0, target, buf.index_select(0, last))
        self.lengths.sub_(active.long())

    def over_bound(self) -> torch.Tensor:
        """``[segments]`` bool: evicting segments holding more than their bound (after an append)."""
        return ~self.grows & (self.lengths > self.bounds)

    def oldest(self, first: int) -> torch.Tensor:
        """``[segments]`` packed index of each segment's oldest valid token at position ``>= first``
        (a sinks + recent window's victim; the segment's first slot if it has none)."""
        pos = self.buffers["positions"]
        cand = self.valid() & (pos >= first)
        big = torch.iinfo(pos.dtype).max
        key = torch.where(cand, pos, big)
        low = torch.full_like(self.offsets, big).scatter_reduce_(0, self.segment, key, "amin")
        hit = cand & (key == low.index_select(0, self.segment))
        index = torch.arange(len(self.segment), device=pos.device)
        found = torch.full_like(self.offsets, -1)
        found.scatter_reduce_(0, self.segment, torch.where(hit, index, -1), "amax")
        return torch.where(found >= 0, found, self.offsets)
