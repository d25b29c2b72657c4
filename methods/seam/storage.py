"""The storage interface of a layer's slots (:class:`SlotStorage`): one class per storage kind, as
transformers keeps one layer class per kind of cache.

A :class:`~methods.seam.layer.CompressedLayer` holds one storage object (``layer.store``) and never
asks which kind it is: the uniform store (``methods.seam.store``, every head of a layer holds the same
number of slots) and the ragged store (``methods.seam.ragged``, each head its own count, packed) both
implement this interface, and a layer changes kind by swapping the object (an allocator's
``layer.store = layer.store.ragged(keep)``). Views are never None: a store that holds no token yet
raises on a view.

Every per-slot field is read as ``[batch, kv_heads, slots, *extra]``: ``keys``/``values`` (post-RoPE,
the model's dtype), ``log_weight`` (float32 attention-logit bias; ``-inf`` on padding), ``positions``
(int64 token index; -1 for a merged slot or padding) and the method's state fields.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from methods.seam.contract import Traits


class SlotStorage(ABC):
    """Where one layer's slots live (module docstring): append, keep, drop, views, per-head slot
    counts, bytes and decode attention. The operations merging methods use (``swap``, ``replace``,
    ``merge_into``, ``reset``) and ``ragged`` (a head-adaptive allocator's swap) belong to the kinds
    that offer them (the uniform store); ``write`` (a field over every held slot) to both."""

    kind: str = "storage"

    # ------------------------------------------------------------------ reading
    @property
    @abstractmethod
    def n_slots(self) -> int:
        """Slots held per KV head (the longest head's); 0 before the first append."""

    @abstractmethod
    def view(self, name: str) -> torch.Tensor:
        """Field ``name`` over the held slots, ``[batch, kv_heads, n_slots, *extra]``.

        Raises
        ------
        KeyError
            For a field the store does not hold, or before the first append.
        """

    @property
    def keys(self) -> torch.Tensor:
        """``[batch, kv_heads, slots, head_dim]`` post-RoPE keys."""
        return self.view("keys")

    @property
    def values(self) -> torch.Tensor:
        """``[batch, kv_heads, slots, head_dim]`` values."""
        return self.view("values")

    @property
    def log_weight(self) -> torch.Tensor:
        """``[batch, kv_heads, slots]`` float32 attention-logit bias of each slot."""
        return self.view("log_weight")

    @property
    def positions(self) -> torch.Tensor:
        """``[batch, kv_heads, slots]`` int64 token index of each slot (-1: merged slot, padding)."""
        return self.view("positions")

    @property
    def state(self) -> Mapping[str, torch.Tensor]:
        """The method's per-slot state fields, read-only: name -> ``[batch, kv_heads, slots, *extra]``."""
        return StateView(self)

    @abstractmethod
    def state_names(self) -> tuple[str, ...]:
        """Names of the method's state fields held here."""

    @abstractmethod
    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]`` int64 slots held by every head."""

    # ------------------------------------------------------------------ writing
    @abstractmethod
    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Append ``k`` tokens to every head: ``keys``/``values`` ``[batch, kv_heads, k, head_dim]``,
        ``positions`` ``[k]`` int64; state fields take their fill value."""

    @abstractmethod
    def make_room(self, k: int) -> None:
        """Grow the buffers now, outside a compiled step, if the next append of ``k`` tokens would
        (a buffer allocated inside a step captured as a CUDA graph would live in the graph's memory
        pool and be overwritten by the next replay)."""

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a decode step reads or writes in place (buffers, index tensors)."""
        return list(self.buffers.values())

    @abstractmethod
    def keep(self, index: torch.Tensor) -> None:
        """Keep the slots ``index`` ``[batch, kv_heads, k]`` (per head, in that order), free the rest."""

    @abstractmethod
    def drop(self, slot: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """Evict slot ``slot`` ``[batch, kv_heads]`` int64 of every head (of the heads where ``active``
        ``[batch, kv_heads]`` bool, when given), in place."""

    # ------------------------------------------------------------------ attention
    @abstractmethod
    def attend(
        self, query: torch.Tensor, scaling: float, traits: Traits, softcap: float | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decode step's attention of ``query`` ``[batch, q_heads, 1, head_dim]`` over the held
        slots; returns the output ``[batch, q_heads, 1, head_dim]`` and what ``traits.needs`` asks
        for (``CompressionMethod.decode_step``), or None (nothing asked, or a fused score update)."""

    # ------------------------------------------------------------------ bytes
    @abstractmethod
    def kv_bytes(self) -> int:
        """Bytes of the held keys and values (the sum over heads of their slots)."""

    @abstractmethod
    def state_bytes(self) -> int:
        """Bytes of the held slots' other fields (bias, positions, method state, index tensors)."""

    @abstractmethod
    def allocated_bytes(self) -> int:
        """Bytes of every buffer behind the store, capacity included."""

    @abstractmethod
    def token_bytes(self) -> int:
        """Key + value bytes one token takes over the batch and every KV head."""


#: What makes a layer's first store: ``(fills, capacity) -> SlotStorage`` (the uniform store's
#: signature, ``methods.seam.store.SlotStore``); a quantized kind has the same.
StorageKind = Callable[[dict[str, float], Callable[[int], int]], "SlotStorage"]


class StateView(Mapping):
    """Read-only mapping name -> a store's state field (views made on access, so they always match
    the store's current slots)."""

    __slots__ = ("store",)

    def __init__(self, store: SlotStorage) -> None:
        self.store = store

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.store.state_names():
            raise KeyError(name)
        return self.store.view(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.store.state_names())

    def __len__(self) -> int:
        return len(self.store.state_names())
