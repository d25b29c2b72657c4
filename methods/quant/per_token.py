"""``quant=int8`` and ``quant=int4``: keys and values quantized per token, asymmetric, in groups of
``group`` consecutive channels (transformers' ``QuantizedCache`` with the quanto backend, whose
groups run along ``head_dim`` of each token; here without its full-precision residual: every token is
quantized when it is appended).

Per slot and KV head: packed codes ``head_dim * bits / 8`` bytes, scale and zero point
``head_dim / group`` values each in the model's dtype, for keys and for values
(``methods.quant.codes``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from methods.quant import codes as q
from methods.quant.base import QuantizedStore
from methods.seam.store import slot_index

#: transformers' ``QuantizedCache`` default group size (``q_group_size``).
GROUP = 64


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

    def __init__(
        self, fills: dict[str, float], capacity: Callable[[int], int], bits: int = 8, group: int = GROUP
    ) -> None:
        q.check_bits(bits)
        super().__init__(fills, capacity)
        self.bits, self.group = bits, group

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
        group = q.group_size(x.shape[-1], self.group)
        c, s, z = q.per_token(x.to(self.dtype), group, self.bits)
        return {f"{name}.codes": c, f"{name}.scale": s, f"{name}.zero": z}

    def _append_codes(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        k = keys.shape[2]
        for name, x in (("keys", keys), ("values", values)):
            for field, t in self._encode(name, x).items():
                self.buffers[field].narrow(2, self.n, k).copy_(t)

    def _read(self, name: str) -> torch.Tensor:
        c, s, z = (self.buffers[f"{name}.{p}"].narrow(2, 0, self.n) for p in ("codes", "scale", "zero"))
        return q.per_token_values(c, s, z, self.bits)

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
