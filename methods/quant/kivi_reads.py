"""How KIVI storage (``methods.quant.kivi``) reads its keys and values back (``layer.keys``,
``layer.values``, every decode step's attention): the codes dequantized with their scales and zero
points, the residual slots' full-precision rows copied in.

While slot ``i`` holds arrival ``i`` (nothing evicted, moved or rebuilt: FullKV over ``quant=kivi2``,
KIVI as the paper runs it), the quantized keys are whole groups of G consecutive slots, so each group's
scale and zero point broadcast over its slots, and the residual slots are the last ones; otherwise every
slot's key group is gathered by its reference. Both give the same tensors
(``tests/test_quant_reference.py``).
"""

from __future__ import annotations

import torch

from methods.quant import codes as q


class KiviReads:
    """The reads of :class:`~methods.quant.kivi.KiviStore` (module docstring), a mixin of it; the
    operations that move slots (``keep``, ``drop``, ``swap``, ``reset``) end the in-order reading and
    the in-order writes of ``KiviStore._append_one`` (any new slot-moving operation must end them too)."""

    in_order: bool

    def _read(self, name: str) -> torch.Tensor:
        if self.in_order:
            return self._read_in_order(name)
        n = self.n
        ref = self.buffers[f"{name}.ref"].narrow(2, 0, n).long()
        packed = self.buffers[f"{name}.codes"].narrow(2, 0, n)
        if name == "keys":
            g = ref.clamp(min=0)
            codes = q.unpack(packed, self.bits, self.dtype)
            full = q.decode(codes, *q.rows(self.key_scale, self.key_zero, index=g))
            rows = self.key_rows
        else:
            s, z = (self.buffers[f"values.{p}"].narrow(2, 0, n) for p in ("scale", "zero"))
            full = q.per_token_values(packed, s, z, self.bits)
            rows = self.value_rows
        # the residual slots (at most R + 1 per head), as flat rows of ``full`` and of ``rows``
        flat = ref.reshape(-1)
        slot = (flat < 0).nonzero().squeeze(1)
        row = torch.div(slot, n, rounding_mode="floor") * rows.shape[2] - 1 - flat[slot]
        d = full.shape[-1]
        full.view(-1, d).index_copy_(0, slot, rows.reshape(-1, d).index_select(0, row))
        return full

    def _read_in_order(self, name: str) -> torch.Tensor:
        """:meth:`_read` while slot ``i`` holds arrival ``i``: keys ``0 .. base - 1`` quantized in
        groups of G slots (group row ``i // G``), the rest in key rows ``0 .. n - base - 1``; values
        ``0 .. n - R - 1`` quantized, arrival ``t`` of the rest in value row ``t % (R + 1)``."""
        n = self.n
        packed = self.buffers[f"{name}.codes"].narrow(2, 0, n)
        if name == "keys":
            nq = self.base
            full = q.unpack(packed, self.bits, self.dtype)
            groups = full.narrow(2, 0, nq).unflatten(2, (-1, self.group))
            groups.mul_(self.key_scale[:, :, : nq // self.group, None])
            groups.add_(self.key_zero[:, :, : nq // self.group, None])
            full.narrow(2, nq, n - nq).copy_(self.key_rows.narrow(2, 0, n - nq))
            return full
        s, z = (self.buffers[f"values.{p}"].narrow(2, 0, n) for p in ("scale", "zero"))
        full = q.per_token_values(packed, s, z, self.bits)
        nq = max(n - self.residual, 0)
        first = nq % (self.residual + 1)  # the ring of rows from ``first``, wrapping to row 0
        head = min(n - nq, self.residual + 1 - first)
        full.narrow(2, nq, head).copy_(self.value_rows.narrow(2, first, head))
        full.narrow(2, nq + head, n - nq - head).copy_(self.value_rows.narrow(2, 0, n - nq - head))
        return full

    def keep(self, index: torch.Tensor) -> None:
        """``SlotStore.keep`` (``index`` ``[batch, kv_heads, k]``); reads gather from then on."""
        self.in_order = False
        super().keep(index)

    def drop(self, slot: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """``SlotStore.drop`` (``slot`` ``[batch, kv_heads]``; raises as it does); reads gather from
        then on."""
        self.in_order = False
        super().drop(slot, active)

    def swap(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """``SlotStore.swap`` (``a``, ``b`` ``[batch, kv_heads]``); reads gather from then on."""
        self.in_order = False
        super().swap(a, b)

    def reset(self, **fields: torch.Tensor) -> None:
        """``SlotStore.reset`` (compact ``[batch, kv_heads, k, *extra]`` fields); reads gather
        from then on."""
        self.in_order = False
        super().reset(**fields)
