"""What KIVI storage (``methods.quant.kivi``) does with slots a method writes (``replace``,
``merge_into``, ``write``, ``reset``: merging methods, re-rotated keys): a slot in a residual gets its
full-precision row rewritten; a quantized value is re-quantized per token; a quantized key with its
group's scale and zero point (clamped to the group's range: the other members keep their codes).
"""

from __future__ import annotations

import torch

from methods.quant import codes as q
from methods.seam.uniform import slot_index


class KiviWrites:
    """The writes of :class:`~methods.quant.kivi.KiviStore` (module docstring), a mixin of it."""

    def _put(self, name: str, slot: torch.Tensor | None, value: torch.Tensor) -> None:
        n = self.n
        if slot is None:
            slot = torch.arange(n, device=value.device).expand(*value.shape[:3])
        ref = self.buffers[f"{name}.ref"].narrow(2, 0, n).gather(2, slot).long()
        res = ref < 0
        rows = self.key_rows if name == "keys" else self.value_rows
        scratch = rows.shape[2] - 1
        target = torch.where(res, -1 - ref, scratch)
        rows.scatter_(2, target.unsqueeze(-1).expand_as(value), value.to(rows.dtype))
        if name == "keys":
            new = {"codes": self._key_codes(value, ref.clamp(min=0))}
        else:
            new = dict(zip(("codes", "scale", "zero"), self._value_codes(value), strict=True))
        for part, t in new.items():
            buf = self.buffers[f"{name}.{part}"]
            old = buf.gather(2, slot_index(buf, slot))
            buf.scatter_(2, slot_index(buf, slot), torch.where(res.unsqueeze(-1), old, t))

    def _encode_all(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """A compact set (``reset``): slots whose token is still in a residual (by position) stay
        there; the other keys are quantized in groups of G slots in slot order, the other values per
        token."""
        b, h, k, d = keys.shape
        r = self.residual
        pos = positions.long() if positions is not None else torch.full((b, h, k), -1, device=keys.device)
        kres = pos >= self.base
        vres = pos >= self.arrived - r
        pad = -k % self.group
        quantized = torch.cat([~kres, kres.new_zeros((b, h, pad))], 2)
        x = torch.cat([keys, keys.new_zeros((b, h, pad, d))], 2).to(self.dtype)
        # quantized keys first, in slot order, so groups of G are made of quantized slots only
        order = (~quantized).to(torch.uint8).argsort(dim=-1, stable=True)
        (sorted_keys,) = q.rows(x, index=order)
        scale, zero = self._key_stats(sorted_keys, quantized.gather(2, order))
        if not scale.shape[2]:
            scale = zero = keys.new_zeros((b, h, 1, d))
        self.key_scale, self.key_zero = scale, zero
        slots = torch.arange(k + pad, device=keys.device).expand_as(order)
        rank = torch.empty_like(order).scatter_(2, order, slots)[:, :, :k]
        g = rank // self.group
        key_ref = torch.where(kres, -1 - (pos - self.base), g).int()
        krow = torch.where(kres, pos - self.base, r)
        self.key_rows.scatter_(2, krow.unsqueeze(-1).expand(b, h, k, d), keys.to(self.dtype))
        key_codes = self._key_codes(keys, g.clamp(max=self.key_scale.shape[2] - 1))
        vrow = torch.where(vres, pos % (r + 1), r + 1)
        self.value_rows.scatter_(2, vrow.unsqueeze(-1).expand(b, h, k, d), values.to(self.dtype))
        c, s, z = self._value_codes(values)
        return {
            "keys.codes": key_codes,
            "keys.ref": key_ref,
            "values.codes": c,
            "values.scale": s,
            "values.zero": z,
            "values.ref": torch.where(vres, -1 - vrow, 0).int(),
        }
