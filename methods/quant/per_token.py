"""``quant=int8`` and ``quant=int4``: keys and values quantized per token, asymmetric, in groups of
``group`` consecutive channels (transformers' ``QuantizedCache`` with the quanto backend, whose
groups run along ``head_dim`` of each token; here without its full-precision residual: every token is
quantized when it is appended).

Per slot and KV head: packed codes ``head_dim * bits / 8`` bytes, scale and zero point
``head_dim / group`` values each in the model's dtype, for keys and for values
(``methods.quant.codes``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from methods.quant import codes as q
from methods.quant.base import QuantizedStore
from methods.quant.ragged import QuantizedRaggedStore
from methods.seam.store import slot_index

#: transformers' ``QuantizedCache`` default group size (``q_group_size``).
GROUP = 64
PARTS = ("codes", "scale", "zero")


@dataclass(frozen=True)
class PerTokenCodec:
    """Per-token codes of keys or values (module docstring) over rows of any leading shape: what the
    uniform store (:class:`PerTokenStore`) and its ragged heads (``methods.quant.ragged``) share.

    Attributes
    ----------
    bits : int
        Bits per code.
    group : int
        Channels sharing a scale and zero point (``head_dim`` when it is smaller).
    """

    bits: int
    group: int

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fields ``<name>.codes`` ``[..., head_dim * bits / 8]`` uint8, ``<name>.scale`` and
        ``<name>.zero`` ``[..., head_dim / group]`` (``x``'s dtype) of ``x`` ``[..., head_dim]``."""
        parts = q.per_token(x, q.group_size(x.shape[-1], self.group), self.bits)
        return {f"{name}.{p}": t for p, t in zip(PARTS, parts, strict=True)}

    def decode(self, name: str, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """:meth:`encode`'s inverse over ``fields`` (name -> tensor): ``[..., head_dim]``."""
        return q.per_token_values(*(fields[f"{name}.{p}"] for p in PARTS), self.bits)


class PerTokenStore(QuantizedStore):
    """Per-token asymmetric quantization of keys and values (module docstring).

    Parameters
    ----------
    fills, capacity
        As :class:`~methods.seam.store.SlotStore`.
    bits : int
        Bits per code (2, 4 or 8).
    group : int
        Channels sharing a scale and zero point (``head_dim`` when it is smaller).

    Raises
    ------
    ValueError
        For a bit width the packing does not take.
    """

    kind = "per-token"
    code_fields = ("keys.codes", "keys.scale", "keys.zero", "values.codes", "values.scale", "values.zero")
    ragged_heads = True

    def __init__(
        self, fills: dict[str, float], capacity: Callable[[int], int], bits: int = 8, group: int = GROUP
    ) -> None:
        q.check_bits(bits)
        super().__init__(fills, capacity)
        self.bits, self.group, self.codec = bits, group, PerTokenCodec(bits, group)

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, cap: int) -> dict[str, torch.Tensor]:
        b, h, _, d = keys.shape
        groups = d // q.group_size(d, self.group)
        out = {}
        for name in ("keys", "values"):
            width = d * self.bits // 8
            out[f"{name}.codes"] = torch.empty((b, h, cap, width), dtype=torch.uint8, device=keys.device)
            for part in ("scale", "zero"):
                out[f"{name}.{part}"] = keys.new_empty((b, h, cap, groups))
        return out

    def _encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.codec.encode(name, x.to(self.dtype))

    def _append_codes(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        k = keys.shape[2]
        for name, x in (("keys", keys), ("values", values)):
            for field, t in self._encode(name, x).items():
                self.buffers[field].narrow(2, self.n, k).copy_(t)

    def _read(self, name: str) -> torch.Tensor:
        return self.codec.decode(name, {f: self.view(f) for f in self.code_fields if f.startswith(name)})

    def _put(self, name: str, slot: torch.Tensor | None, value: torch.Tensor) -> None:
        for field, t in self._encode(name, value).items():
            buf = self.buffers[field]
            if slot is None:
                buf.narrow(2, 0, self.n).copy_(t)
            else:
                buf.scatter_(2, slot_index(buf, slot), t)

    def _encode_all(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        return self._encode("keys", keys) | self._encode("values", values)

    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> QuantizedRaggedStore:
        """``SlotStore.ragged`` over the codes: the kept slots' codes, scales and zero points packed per
        head as they are (no token is re-quantized), in a
        :class:`~methods.quant.ragged.QuantizedRaggedStore` that decodes with :attr:`codec`."""
        room = self.capacity_for(self.n + 1) - self.n
        fields = {name: self.view(name) for name in (*self.code_fields, "positions")}
        return QuantizedRaggedStore.from_mask(fields, keep, room, bounds, codec=self.codec)
