"""The buffers of the uniform layout (:class:`SlotBuffers`): one decoder layer's slots in fixed-capacity
buffers, read as views, grown by the seam's append (docs/design.md, "The slot store").

Every per-slot tensor (``keys``, ``values``, ``log_weight``, ``positions`` and the method's
state, e.g. scores or fusion counts) lives in one buffer ``[batch, kv_heads, capacity, *extra]``
whose first ``n`` slots are valid; the same ``n`` for every head. Readers get views of the valid
slots (:meth:`SlotBuffers.view`). Capacity comes from the owner's rule (``CompressedLayer``:
the method's per-layer bound plus the slot a decode step appends before it evicts), so once a
layer is full every decode step sees the same shapes. Keys and values are held by the store's codec
(``methods.seam.storage``): as themselves, or as its code fields, each a buffer like any other. The
operations that write the buffers are :class:`~methods.seam.uniform.SlotStore`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from methods.seam.storage import KV, PLAIN, Codec

#: Fields every store has, besides the method's state: name -> fill of slots appended by the seam.
BASE_FILLS = {"log_weight": 0.0}


class SlotBuffers:
    """Fixed-capacity slot buffers of one layer (module docstring): reading, the seam's append and the
    capacity rule; :class:`~methods.seam.uniform.SlotStore` adds the methods' operations.

    Parameters
    ----------
    fills : dict[str, float]
        The method's state fields and the value a slot appended by the seam starts with
        (``Traits.state_fill``); ``log_weight`` (0) is always present.
    capacity : Callable[[int], int]
        Slots to allocate for a buffer that must hold ``needed`` slots (the owner's rule).
    codec : Codec
        How keys and values are held (default: as they are).

    Attributes
    ----------
    n : int
        Valid slots per (batch, KV head).
    buffers : dict[str, torch.Tensor]
        ``[batch, kv_heads, capacity, *extra]`` per field: ``keys``/``values`` (or the codec's fields),
        ``log_weight`` and method state float32, ``positions`` int64.
    kv_fields : tuple[str, ...]
        The buffers holding keys and values (counted as key/value bytes); set by the first append.
    dtype : torch.dtype | None
        The model's dtype of keys and values (set by the first append).
    count : torch.Tensor | None
        ``[]`` int64 on the buffers' device: the valid slots, kept by the compiled steps of a growing
        layer (:meth:`count_ahead`); None until its first.
    """

    def __init__(self, fills: dict[str, float], capacity: Callable[[int], int], codec: Codec = PLAIN) -> None:
        self.fills = BASE_FILLS | dict(fills)
        self.capacity_for, self.codec = capacity, codec
        self.buffers: dict[str, torch.Tensor] = {}
        self.n, self.token, self.kv_fields = 0, 0, KV
        self.dtype: torch.dtype | None = None
        self.count: torch.Tensor | None = None
        self._ahead, self._synced = 0, -1  # slots counted ahead; ``n`` when ``count`` was last right

    # ------------------------------------------------------------------ reading
    @property
    def n_slots(self) -> int:
        """Valid slots per (batch, KV head)."""
        return self.n

    def view(self, name: str) -> torch.Tensor:
        """The valid slots of field ``name``: ``[batch, kv_heads, n, *extra]`` (a view; keys and values
        held as codes: decoded, a new tensor in the model's dtype).

        Raises
        ------
        KeyError
            For a field the store does not hold, or before the first append.
        """
        if name in self.buffers:
            return self.buffers[name].narrow(2, 0, self.n)
        if name in KV and self.buffers:
            return self._read(name)
        raise KeyError(f"the layer holds no {name!r} (fields: {sorted(self.buffers) or 'none yet'})")

    def _read(self, name: str, whole: bool = False) -> torch.Tensor:
        """Keys or values held as codes, decoded: ``[batch, kv_heads, n, head_dim]`` (model dtype);
        ``whole``: over every slot of the capacity."""
        fields = {
            f: self.buffers[f] if whole else self.view(f) for f in self.kv_fields if f.startswith(f"{name}.")
        }
        return self.codec.decode(name, fields).to(self.dtype)

    def _whole(self, name: str) -> torch.Tensor:
        """Field ``name`` over every slot of the capacity, valid or not: ``[batch, kv_heads, capacity,
        *extra]`` (keys and values held as codes: decoded)."""
        return self.buffers[name] if name in self.buffers else self._read(name, whole=True)

    def state_names(self) -> tuple[str, ...]:
        """The method's state fields (``Traits.state_fill``)."""
        return tuple(name for name in self.fills if name != "log_weight")

    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]`` int64, every head ``n``."""
        b, h = self.buffers["positions"].shape[:2] if self.buffers else (1, 1)
        return torch.full((b, h), self.n, dtype=torch.long)

    @property
    def capacity(self) -> int:
        """Slots the buffers hold (valid or not)."""
        return self.buffers["positions"].shape[2] if self.buffers else 0

    def tensors(self) -> list[torch.Tensor]:
        """The buffers, and the device count of a growing layer's compiled steps (:meth:`count_ahead`)."""
        return [*self.buffers.values(), *([] if self.count is None else [self.count])]

    def allocated_bytes(self) -> int:
        """Bytes of every buffer, capacity included."""
        return sum(buf.untyped_storage().nbytes() for buf in self.buffers.values())

    def kv_bytes(self) -> int:
        """Bytes of the held slots' keys and values (or their codes)."""
        return sum(self.buffers[f].narrow(2, 0, self.n).nbytes for f in self.kv_fields if f in self.buffers)

    def state_bytes(self) -> int:
        """Bytes of the held slots' bias, positions and method state."""
        names = [name for name in self.buffers if name not in self.kv_fields]  # none before an append
        return sum(self.view(name).numel() * self.buffers[name].element_size() for name in names)

    def token_bytes(self) -> int:
        """Key + value bytes of one token in the model's dtype over the batch and every KV head (what
        the uncompressed cache holds per token)."""
        return self.token

    # ------------------------------------------------------------------ the seam's append
    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Append ``k`` slots: ``keys``/``values`` ``[batch, kv_heads, k, head_dim]``, ``positions``
        ``[k]`` int64 (the same tokens for every head); other fields take their fill value. The
        first call allocates the buffers with the incoming dtype and device; after :meth:`count_ahead`,
        the slots are written at the device count ``count`` (no host integer)."""
        k = keys.shape[2]
        if self._ahead:
            self._ahead, at = 0, self.count + torch.arange(k, device=self.count.device)
            fields = self._encode(keys, values) | {"positions": positions.expand(*keys.shape[:2], k)}
            for name, t in fields.items():
                self.buffers[name].index_copy_(2, at, t)
            for name, fill in self.fills.items():
                self.buffers[name].index_fill_(2, at, fill)
            self.count += k
            return
        if not self.buffers:
            self._allocate(keys, values, self.capacity_for(k))
        else:
            self.make_room(k)
        n, buffers = self.n, self.buffers
        self._append_kv(keys, values)
        buffers["positions"].narrow(2, n, k).copy_(positions)
        for name, fill in self.fills.items():
            buffers[name].narrow(2, n, k).fill_(fill)
        self.n = n + k

    def _encode(self, keys: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
        """The codec's fields of ``keys`` and ``values`` ``[batch, kv_heads, k, head_dim]``."""
        codec, dtype = self.codec, self.dtype
        return codec.encode("keys", keys.to(dtype)) | codec.encode("values", values.to(dtype))

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, cap: int) -> None:
        """The buffers for ``cap`` slots, shaped as the codec's fields of the first token."""
        b, h = keys.shape[:2]
        self.dtype, self.token = keys.dtype, b * h * (keys.shape[-1] + values.shape[-1]) * keys.element_size()
        first = self._encode(keys[:, :, :1], values[:, :, :1])
        self.buffers = {f: t.new_empty((b, h, cap, *t.shape[3:])) for f, t in first.items()}
        self.kv_fields = tuple(first)
        self.buffers["positions"] = torch.empty((b, h, cap), dtype=torch.long, device=keys.device)
        for name in self.fills:
            self.buffers[name] = torch.empty((b, h, cap), dtype=torch.float32, device=keys.device)

    def _append_kv(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``k`` appended tokens' keys and values at slots ``n .. n + k - 1``."""
        for field, t in self._encode(keys, values).items():
            self.buffers[field].narrow(2, self.n, t.shape[2]).copy_(t)

    def make_room(self, k: int) -> None:
        """Reallocate now (to the owner's capacity) if ``k`` more slots do not fit
        (``SlotStorage.make_room``)."""
        if self.buffers and self.n + k > self.capacity:
            self._reallocate(self.capacity_for(self.n + k))

    def count_ahead(self, k: int, grows: bool) -> None:
        """Before a compiled step of ``k`` tokens (``SlotStorage.count_ahead``): on a growing layer, with
        room made, ``n`` counts the step's slots now, and the step writes them at the device count
        ``count`` and attends over the whole capacity with a validity mask (:meth:`attend`), as
        transformers' StaticCache does: its graph has the same shapes and no host integer at every step
        (Dynamo would recompile as ``n`` changes, CUDA graph trees record one graph per value). The
        count is set from ``n``, and the slots past it zeroed (masked slots must hold finite numbers;
        buffers grown later are zeroed, :meth:`_reallocate`), whenever ``n`` changed outside these
        steps. A bounded layer is static once full: nothing."""
        if not grows:
            return
        if self.n != self._synced:
            for buf in self.buffers.values():
                buf.narrow(2, self.n, buf.shape[2] - self.n).zero_()
            if self.count is None:
                self.count = torch.zeros((), dtype=torch.long, device=self.buffers["positions"].device)
            self.count.fill_(self.n)
        self.n += k
        self._ahead, self._synced = k, self.n

    def _reallocate(self, cap: int) -> None:
        """Move the valid slots into buffers of ``cap`` slots, zeros past them (the old ones are
        released)."""
        new = {}
        for name, buf in self.buffers.items():
            new[name] = buf.new_zeros((*buf.shape[:2], cap, *buf.shape[3:]))
            new[name][:, :, : self.n] = buf[:, :, : self.n]
        self.buffers = new
