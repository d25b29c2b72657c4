"""``quant=int8`` and ``quant=int4``: keys and values quantized per token, asymmetric, in groups of
``group`` consecutive channels (transformers' ``QuantizedCache`` with the quanto backend, whose
groups run along ``head_dim`` of each token; here without its full-precision residual: every token is
quantized when it is appended).

Per slot and KV head: packed codes ``head_dim * bits / 8`` bytes, scale and zero point
``head_dim / group`` values each in the model's dtype, for keys and for values
(``methods.quant.codes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from methods.quant import codes as q
from methods.quant.registry import register_codec

#: transformers' ``QuantizedCache`` default group size (``q_group_size``).
GROUP = 64
PARTS = ("codes", "scale", "zero")


@register_codec("int8", "int4")
@dataclass(frozen=True)
class PerTokenCodec:
    """Per-token codes of keys or values (module docstring) over rows of any leading shape.

    Attributes
    ----------
    bits : int
        Bits per code (2, 4 or 8).
    group : int
        Channels sharing a scale and zero point (``head_dim`` when it is smaller).

    Raises
    ------
    ValueError
        For a bit width the packing does not take.
    """

    bits: int = 8
    group: int = GROUP

    def __post_init__(self) -> None:
        q.check_bits(self.bits)

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fields ``<name>.codes`` ``[..., head_dim * bits / 8]`` uint8, ``<name>.scale`` and
        ``<name>.zero`` ``[..., head_dim / group]`` (``x``'s dtype) of ``x`` ``[..., head_dim]``."""
        parts = q.per_token(x, q.group_size(x.shape[-1], self.group), self.bits)
        return {f"{name}.{p}": t for p, t in zip(PARTS, parts, strict=True)}

    def decode(self, name: str, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """:meth:`encode`'s inverse over ``fields`` (field -> tensor): ``[..., head_dim]``."""
        return q.per_token_values(*(fields[f"{name}.{p}"] for p in PARTS), self.bits)
