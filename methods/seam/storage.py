"""The storage interface of a layer's slots: a store is a **layout** holding a **codec**.

- Layouts: the uniform store (``methods.seam.uniform``, every head of a layer holds the same number of
  slots) and ragged heads (``methods.seam.ragged``, each head its own count, packed). Both implement
  :class:`SlotStorage`; the uniform store also :class:`MergingStorage` (the operations merging
  methods use). A layer changes layout by swapping the object (a head-adaptive allocator's
  ``layer.store = layer.store.ragged(keep)``), and the codec is handed on.
- Codecs (:class:`Codec`): how keys and values are held, as themselves (:data:`PLAIN`) or as codes
  (``quant=``, ``methods.quant``). A codec turns rows of keys or values into its fields and back.

A :class:`~methods.seam.layer.CompressedLayer` holds one store (``layer.store``) and never asks which
kind it is. Views are never None: a store that holds no token yet raises on a view.

Every per-slot field is read as ``[batch, kv_heads, slots, *extra]``: ``keys``/``values`` (post-RoPE,
the model's dtype), ``log_weight`` (float32 attention-logit bias; ``-inf`` on padding), ``positions``
(int64 token index; -1 for a merged slot or padding) and the method's state fields.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from methods.seam.traits import Traits

#: The two fields a codec holds.
KV = ("keys", "values")


class Codec(Protocol):
    """How keys or values are held (module docstring): stateless, over rows of any leading shape."""

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The fields (``name``, or ``<name>.<part>``) ``[..., *extra]`` holding ``x`` ``[..., head_dim]``
        (already in the model's dtype)."""

    def decode(self, name: str, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """:meth:`encode`'s inverse over ``fields`` (field -> tensor): ``[..., head_dim]``."""


class Plain:
    """The codec of full-precision storage: keys and values held as they are (``quant=none``)."""

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: x}``."""
        return {name: x}

    def decode(self, name: str, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``fields[name]`` (never called by the stores: a field held as it is is read as a view)."""
        return fields[name]


PLAIN = Plain()


class SlotStorage(ABC):
    """Where one layer's slots live (module docstring): append, keep, drop, write, views, per-head
    slot counts, bytes, decode attention and the swap to ragged heads.

    Attributes
    ----------
    kind : str
        The layout: ``"uniform"`` or ``"ragged"``.
    codec : Codec
        How keys and values are held (handed on to ragged heads).
    """

    kind: str = "storage"
    codec: Codec = PLAIN

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
        """The method's per-slot state fields, read-only: name -> ``[batch, kv_heads, slots, *extra]``
        (views made on access, so they match the store's current slots)."""
        return MappingProxyType({name: self.view(name) for name in self.state_names()})

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

    @abstractmethod
    def count_ahead(self, k: int, grows: bool) -> None:
        """Before a compiled decode step of ``k`` tokens, eagerly, after :meth:`make_room`: count the
        step's append now, so that the step's graph reads no host count that changes per step
        (``methods.seam.step.prepare_step``; ``grows``: the layer has no decode-time bound and decode
        attention hands its rule nothing). A host count the step still reads makes Dynamo recompile
        (or turn it symbolic) as it changes."""

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

    @abstractmethod
    def write(self, name: str, value: torch.Tensor) -> None:
        """Set field ``name`` over every held slot to ``value`` ``[batch, kv_heads, n_slots, *extra]``
        (a codec encodes keys and values): key re-rotation, a method's scores."""

    @abstractmethod
    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> SlotStorage:
        """The slots ``keep`` ``[batch, kv_heads, slots]`` (bool) selects, as ragged heads holding the
        same codec (``methods.seam.ragged``; ``bounds`` ``[batch, kv_heads]`` as there).

        Raises
        ------
        NotImplementedError
            For a layout that is ragged already.
        """

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


class MergingStorage(SlotStorage):
    """A store that offers the operations of merging methods (``Traits.merges``) and of methods that
    rewrite chosen slots: the uniform store."""

    @abstractmethod
    def swap(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Exchange slots ``a`` and ``b`` ``[batch, kv_heads]`` int64 of every head, in place."""

    @abstractmethod
    def replace(self, slot: torch.Tensor, **fields: torch.Tensor | float) -> None:
        """Write ``fields`` at ``slot`` ``[batch, kv_heads, k]`` int64: each a tensor
        ``[batch, kv_heads, k, *extra]`` or a scalar (a method's state field)."""

    @abstractmethod
    def merge_into(
        self,
        target: torch.Tensor,
        source: torch.Tensor,
        weight_target: torch.Tensor,
        weight_source: torch.Tensor,
        fields: tuple[str, ...] = KV,
    ) -> None:
        """Replace slot ``target`` by the weighted mean of ``target`` and ``source`` (``[batch,
        kv_heads, 1]`` each, weights too) for each of ``fields``; the source slot is left as it is."""

    @abstractmethod
    def reset(self, **fields: torch.Tensor) -> None:
        """Replace every slot at once by compact tensors ``[batch, kv_heads, k, *extra]`` (merge
        rebuilds); fields not given take their fill value (positions: -1)."""


#: What makes a layer's first store: ``(fills, capacity) -> SlotStorage`` (the uniform store's
#: signature, ``methods.seam.uniform.SlotStore``, with its codec bound: ``partial(SlotStore, codec=...)``).
StorageKind = Callable[[dict[str, float], Callable[[int], int]], "SlotStorage"]
