"""What the quantized storage kinds share: a uniform slot store (:class:`~methods.seam.store.SlotStore`)
whose keys and values are held as codes, read back by dequantizing.

Every per-slot tensor of the encoding (packed codes, per-token scales and zero points, a slot's
reference into a side table) is a buffer ``[batch, kv_heads, capacity, *extra]`` of the uniform store,
so its operations (``keep``, ``drop``, ``swap``, growth) move the codes of the kept slots as they are:
a token is quantized once, eviction never re-quantizes it. The views ``keys``/``values`` are the
dequantized tensors; writes of keys or values (``replace``, ``merge_into``, ``write``, ``reset``:
merging methods and key re-rotation) quantize what they write (:meth:`QuantizedStore._put`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

import torch

from methods.seam.store import SlotStore, gather_slots

KV = ("keys", "values")


class QuantizedStore(SlotStore):
    """A uniform store of quantized keys and values (module docstring).

    Parameters
    ----------
    fills, capacity
        As :class:`~methods.seam.store.SlotStore`.

    Attributes
    ----------
    code_fields : tuple[str, ...]
        The per-slot buffers of the encoding (counted as key/value bytes, never as method state).
    ragged_heads : bool
        Whether the kind holds ragged heads (:meth:`ragged`; head-adaptive allocators).
    dtype : torch.dtype | None
        The model's dtype of keys and values (set by the first append): views are read back in it.
    """

    kind = "quantized"
    code_fields: tuple[str, ...] = ()
    ragged_heads = False

    def __init__(self, fills: dict[str, float], capacity: Callable[[int], int]) -> None:
        super().__init__(fills, capacity)
        self.dtype: torch.dtype | None = None
        self.shape: tuple[int, int, int] = (1, 1, 0)  # batch, kv_heads, head_dim

    # ------------------------------------------------------------------ encoding (per kind)
    @abstractmethod
    def _append_codes(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Quantize and write ``k`` appended tokens ``[batch, kv_heads, k, head_dim]`` at slots
        ``n .. n + k - 1`` (the buffers exist and have room; ``self.n`` is not advanced yet)."""

    @abstractmethod
    def _read(self, name: str) -> torch.Tensor:
        """The dequantized ``keys`` or ``values`` of the valid slots ``[batch, kv_heads, n, head_dim]``."""

    @abstractmethod
    def _put(self, name: str, slot: torch.Tensor | None, value: torch.Tensor) -> None:
        """Quantize and write ``value`` ``[batch, kv_heads, k, head_dim]`` as ``keys`` or ``values``
        at ``slot`` ``[batch, kv_heads, k]`` (None: every valid slot, ``k = n``)."""

    @abstractmethod
    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, cap: int) -> dict[str, torch.Tensor]:
        """The encoding's per-slot buffers for ``cap`` slots (first append)."""

    def side_bytes(self) -> int:
        """Bytes of the held entries of side tables (none here)."""
        return 0

    def side_allocated(self) -> int:
        """Bytes of the side tables' storage (none here)."""
        return 0

    # ------------------------------------------------------------------ reading
    def view(self, name: str) -> torch.Tensor:
        """Dequantized ``keys``/``values`` (a new tensor, in the model's dtype), other fields as the
        uniform store's views.

        Raises
        ------
        KeyError
            For a field the store does not hold, or before the first append.
        """
        if name in KV:
            if not self.buffers:
                raise KeyError(f"the layer holds no {name!r} yet")
            return self._read(name)
        return super().view(name)

    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]`` int64, every head ``n``."""
        return torch.full(self.shape[:2], self.n, dtype=torch.long)

    @property
    def capacity(self) -> int:
        """Slots the buffers hold (valid or not)."""
        return self.buffers["positions"].shape[2] if self.buffers else 0

    # ------------------------------------------------------------------ bytes
    def _held(self, names: tuple[str, ...]) -> int:
        return sum(self.buffers[f].narrow(2, 0, self.n).nbytes for f in names if f in self.buffers)

    def kv_bytes(self) -> int:
        """Bytes of the held slots' codes, scales, zero points, references and full-precision rows,
        plus the held entries of side tables (:meth:`side_bytes`)."""
        return self._held(self.code_fields) + self.side_bytes() if self.buffers else 0

    def state_bytes(self) -> int:
        """Bytes of the held slots' bias, positions and method state."""
        names = tuple(f for f in self.buffers if f not in self.code_fields)
        return self._held(names)

    def allocated_bytes(self) -> int:
        """Bytes of every buffer and side table, capacity included."""
        return super().allocated_bytes() + self.side_allocated()

    def token_bytes(self) -> int:
        """Key + value bytes of one token in the model's dtype, over the batch and every KV head:
        what the uncompressed cache holds per token (``CompressedCache.fullkv_bytes``)."""
        if self.dtype is None:
            return 0
        b, h, d = self.shape
        return b * h * 2 * d * torch.empty((), dtype=self.dtype).element_size()

    # ------------------------------------------------------------------ writing
    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Quantize and append ``k`` tokens (``SlotStorage.append``); other fields take their fill.

        Raises
        ------
        ValueError
            If keys and values differ in head_dim, or head_dim does not suit the encoding.
        """
        b, h, k = keys.shape[:3]
        if not self.buffers:
            if keys.shape[-1] != values.shape[-1]:
                raise ValueError("quantized storage needs keys and values of one head_dim")
            self.dtype, self.shape = keys.dtype, (b, h, keys.shape[-1])
            cap = self.capacity_for(k)
            self.buffers = self._allocate(keys, values, cap)
            self.buffers["positions"] = torch.empty((b, h, cap), dtype=torch.long, device=keys.device)
            for name in self.fills:
                self.buffers[name] = torch.empty((b, h, cap), dtype=torch.float32, device=keys.device)
        elif self.n + k > self.capacity:
            self._reallocate(self.capacity_for(self.n + k))
        n = self.n
        self._append_codes(keys, values, positions)
        self.buffers["positions"].narrow(2, n, k).copy_(positions)
        for name, fill in self.fills.items():
            self.buffers[name].narrow(2, n, k).fill_(fill)
        self.n = n + k

    def replace(self, slot: torch.Tensor, **fields: torch.Tensor | float) -> None:
        """``SlotStore.replace``; keys and values given are quantized (:meth:`_put`)."""
        for name in KV:
            if name in fields:
                value = fields.pop(name)
                self._put(name, slot, torch.as_tensor(value).expand(*slot.shape, self.shape[2]))
        super().replace(slot, **fields)

    def merge_into(
        self,
        target: torch.Tensor,
        source: torch.Tensor,
        weight_target: torch.Tensor,
        weight_source: torch.Tensor,
        fields: tuple[str, ...] = KV,
    ) -> None:
        """``SlotStore.merge_into``: the weighted mean of the dequantized slots, quantized into
        ``target`` (:meth:`_put`); other fields as the uniform store."""
        total = weight_target + weight_source
        for name in (f for f in fields if f in KV):
            full = self._read(name).float()
            w_t = (weight_target.float() / total.float()).unsqueeze(-1)
            mean = w_t * gather_slots(full, target) + (1 - w_t) * gather_slots(full, source)
            self._put(name, target, mean)
        rest = tuple(f for f in fields if f not in KV)
        if rest:
            super().merge_into(target, source, weight_target, weight_source, rest)

    def write(self, name: str, value: torch.Tensor) -> None:
        """``SlotStore.write``; keys or values are quantized (:meth:`_put`)."""
        if name in KV:
            self._put(name, None, value)
        else:
            super().write(name, value)

    def reset(self, **fields: torch.Tensor) -> None:
        """``SlotStore.reset``: every slot replaced by compact tensors; the keys and values given are
        quantized afresh (:meth:`_encode_all`)."""
        keys, values = fields.pop("keys"), fields.pop("values")
        codes = self._encode_all(keys, values, fields.get("positions"))
        super().reset(keys=keys, **codes, **fields)  # keys give the slot count only: no such buffer

    @abstractmethod
    def _encode_all(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """The encoding's per-slot fields ``[batch, kv_heads, k, *extra]`` of a compact set of ``k``
        slots (``reset``), side tables rebuilt for them."""

    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None):
        """Not offered by a kind without :attr:`ragged_heads`: head-adaptive allocators are refused
        over it (``methods.quant.check_method``).

        Raises
        ------
        NotImplementedError
            Always.
        """
        raise NotImplementedError(f"{self.kind} storage has no ragged heads (head-adaptive allocators)")
