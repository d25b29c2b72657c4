"""Ragged heads over quantized storage: a :class:`~methods.seam.ragged.RaggedStore` whose packed
buffers are the codes of keys and values (a per-token kind's codes, scales and zero points,
``[total, *extra]``) instead of the tensors themselves.

A uniform quantized store makes one when a head-adaptive allocator swaps it
(``PerTokenStore.ragged``): the kept slots' codes are packed as they are, so no token is quantized
twice; eviction (``drop``) moves codes. A decode step's token is quantized once, when appended; a
method's ``write`` (re-rotated keys) quantizes what it writes. Views and decode attention read the
buffers dequantized (one pass over the packed codes, then ``kernels.ragged_decode`` on the
dequantized tensors: no kernel reads codes). Key/value bytes are the codes, scales and zero points of
the valid slots, summed over heads.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from methods.seam.ragged import KV, RaggedStore


class Codec(Protocol):
    """How a quantized kind turns rows of keys or values into its code fields and back
    (``methods.quant.per_token.PerTokenCodec``)."""

    bits: int

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Code fields ``<name>.<part>`` ``[..., *extra]`` of ``x`` ``[..., head_dim]``."""

    def decode(self, name: str, fields: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[..., head_dim]`` values of the code fields of ``name`` (scale's dtype)."""


class QuantizedRaggedStore(RaggedStore):
    """Packed per-head code buffers of one layer (module docstring).

    Parameters
    ----------
    *layout
        ``buffers, offsets, capacity, lengths, shape, bounds, room``, as
        :class:`~methods.seam.ragged.RaggedStore` takes them; ``buffers`` holds ``positions`` and the code
        fields instead of ``keys`` and ``values``.
    codec : Codec
        The kind's encoding.
    """

    kind = "quantized-ragged"

    def __init__(self, *layout: Any, codec: Codec) -> None:
        super().__init__(*layout)
        self.codec = codec
        self.kv_fields = tuple(name for name in self.buffers if name != "positions")

    def _packed(self, name: str) -> torch.Tensor:
        """Keys or values dequantized over the whole buffer ``[total, head_dim]``; other fields as
        they are."""
        if name in KV:
            return self.codec.decode(name, self.buffers)
        return super()._packed(name)

    def _encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.codec.encode(name, x)

    def token_bytes(self) -> int:
        """Key + value bytes of one token in the model's dtype (the scales'), over the batch and every
        KV head: what the uncompressed cache holds per token."""
        head_dim = self.buffers["keys.codes"].shape[-1] * 8 // self.codec.bits
        return len(self.offsets) * 2 * head_dim * self.buffers["keys.scale"].element_size()
