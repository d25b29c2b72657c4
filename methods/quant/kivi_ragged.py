"""Ragged heads over KIVI storage (``methods.quant.kivi``): a :class:`~methods.seam.ragged.RaggedStore`
whose packed buffers are KIVI's per-slot fields (key and value codes, value scales and zero points,
the two int32 references), with KIVI's side tables kept per segment (``s = b * kv_heads + h``): key
group scales and zero points ``[segments, groups, head_dim]``, residual rows ``[segments, R + 1,
head_dim]`` of keys and ``[segments, R + 2, head_dim]`` of values.

``KiviStore.ragged`` packs the kept slots' codes and references as they are (no token is quantized
twice) and copies the side tables, releasing the key groups no kept slot refers to. Every segment
receives every decode token, so the arrival counters of the uniform store (``arrived``, ``base``) hold
for each segment and KIVI's rule runs per segment unchanged: a token enters its segment's residuals;
the value of arrival ``t - R`` leaves the value residual (quantized per token) where the segment still
holds it; when the key residual holds R arrivals, the segment's residual keys still held are quantized
as one block, per-channel min/max over each group of G arrivals (``methods.quant.kivi_math.key_stats``).
Eviction (``drop``) moves codes and references. Decode attention dequantizes and runs
``kernels.ragged_decode``. Written keys or values (key re-rotation) are re-quantized as the uniform
store does (``methods.quant.kivi_writes``).
"""

from __future__ import annotations

from typing import Any

import torch

from methods.quant import codes as q
from methods.quant.kivi_math import held_bytes, key_stats, value_codes
from methods.seam.ragged import RaggedStore
from methods.seam.storage import KV
from methods.seam.uniform import SlotStore


def _rows(table: torch.Tensor, segment: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[segment[i], index[i]]`` of a table ``[segments, rows, d]`` (index clamped to its rows:
    never-written slots hold stale references): ``[len(index), d]``."""
    s, rows, d = table.shape
    flat = segment * rows + index.long().clamp(0, rows - 1)
    return table.reshape(s * rows, d).index_select(0, flat)


class KiviRaggedStore(RaggedStore):
    """Packed per-head KIVI fields of one layer, side tables per segment (module docstring).

    Parameters
    ----------
    *layout
        ``buffers, offsets, capacity, lengths, shape, bounds, room``, as
        :class:`~methods.seam.ragged.RaggedStore` takes them; ``buffers`` holds ``positions`` and KIVI's
        code fields (``KiviStore.code_fields``) instead of ``keys`` and ``values``.
    source : SlotStore
        The uniform KIVI store the slots come from (``methods.quant.kivi.KiviStore``): its parameters,
        arrival counters and side tables
        (copied).
    """

    def __init__(self, *layout: Any, source: SlotStore) -> None:
        super().__init__(*layout)
        self.bits, self.group, self.residual = source.bits, source.group, source.residual
        self.dtype = source.dtype
        self.arrived, self.base = source.arrived, source.base
        s, d = len(self.offsets), source.shape[2]
        tables = (source.key_scale, source.key_zero, source.key_rows, source.value_rows)
        copies = (t.reshape(s, -1, d).clone() for t in tables)
        self.key_scale, self.key_zero, self.key_rows, self.value_rows = copies
        self._compact()

    # ------------------------------------------------------------------ reading
    def _packed(self, name: str) -> torch.Tensor:
        """Keys or values dequantized over the whole buffer ``[total, head_dim]`` (residual slots: their
        full-precision rows); other fields as they are."""
        if name not in KV:
            return super()._packed(name)
        ref = self.buffers[f"{name}.ref"].long()
        if name == "keys":
            codes = q.unpack(self.buffers["keys.codes"], self.bits, self.dtype)
            g = ref.clamp(min=0)
            scale, zero = _rows(self.key_scale, self.segment, g), _rows(self.key_zero, self.segment, g)
            full = q.decode(codes, scale, zero)
            rows = self.key_rows
        else:
            fields = (self.buffers[f"values.{p}"] for p in ("codes", "scale", "zero"))
            full = q.per_token_values(*fields, self.bits)
            rows = self.value_rows
        residual = _rows(rows, self.segment, -1 - ref)
        return torch.where((ref < 0).unsqueeze(-1), residual, full)

    # ------------------------------------------------------------------ bytes
    def _referenced(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[segments, groups]`` bool: key groups a held slot refers to; ``[total]`` bool: the held
        slots with a quantized key; ``[total]`` int64: their flat group row."""
        s, groups = self.key_scale.shape[:2]
        ref = self.buffers["keys.ref"].long()
        held = self.valid() & (ref >= 0)
        flat = self.segment * groups + ref.clamp(0, groups - 1)
        used = torch.zeros(s * groups, dtype=torch.long, device=ref.device).scatter_add_(0, flat, held.long())
        return (used > 0).view(s, groups), held, flat

    def kv_bytes(self) -> int:
        """Bytes held (``KiviStore.kv_bytes`` summed over segments): both references of every held
        slot, codes of its quantized key, codes, scales and zero points of its quantized value,
        full-precision rows of its residual key and value, scale and zero rows of referenced groups."""
        valid = self.valid()
        return held_bytes(
            self.buffers["keys.ref"][valid],
            self.buffers["values.ref"][valid],
            self.buffers["keys.codes"].shape[-1],
            2 * self.buffers["values.scale"][0].nbytes,
            self.key_rows[0, 0].nbytes,
            int(self._referenced()[0].sum()),
        )

    def token_bytes(self) -> int:
        """Key + value bytes of one token in the model's dtype, over the batch and every KV head."""
        return len(self.offsets) * 2 * self.key_rows[0, 0].nbytes

    def allocated_bytes(self) -> int:
        """``RaggedStore.allocated_bytes`` plus the side tables."""
        tables = (self.key_scale, self.key_zero, self.key_rows, self.value_rows)
        return super().allocated_bytes() + sum(t.untyped_storage().nbytes() for t in tables)

    # ------------------------------------------------------------------ writing
    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Append one token ``[batch, kv_heads, 1, head_dim]`` to every segment by KIVI's rule
        (module docstring); room as ``RaggedStore.append``.

        Raises
        ------
        ValueError
            For more than one token.
        """
        at = self._reserve(keys)
        r, t = self.residual, self.arrived
        self.key_rows[:, t - self.base] = keys.reshape(len(at), -1)
        self.value_rows[:, t % (r + 1)] = values.reshape(len(at), -1)
        self.buffers["keys.ref"].index_fill_(0, at, self.base - 1 - t)
        self.buffers["values.ref"].index_fill_(0, at, -1 - t % (r + 1))
        self.buffers["positions"].index_copy_(0, at, positions.expand(len(at)))
        self.lengths.add_(1)
        self.arrived = t + 1
        if t >= r:
            self._leave((t - r) % (r + 1))
        if self.arrived - self.base == r:
            self._flush()

    def _leave(self, row: int) -> None:
        """The value in residual row ``row`` of each segment leaves it: quantized per token where a
        held slot refers to it."""
        ref = self.buffers["values.ref"]
        leaving = (self.valid() & (ref == -1 - row)).unsqueeze(-1)
        x = self.value_rows[:, row]
        new = value_codes(x, self.group, self.bits)
        for part, t in zip(("codes", "scale", "zero"), new, strict=True):
            buf = self.buffers[f"values.{part}"]
            buf.copy_(torch.where(leaving, t.index_select(0, self.segment), buf))
        ref.masked_fill_(leaving.squeeze(-1), 0)

    def _flush(self) -> None:
        """Quantize each segment's held residual keys as one block of R arrivals (module docstring)."""
        r = self.residual
        ref = self.buffers["keys.ref"]
        res = self.valid() & (ref < 0)
        row = (-1 - ref.long()).clamp(0, r - 1)
        present = torch.zeros((len(self.offsets), r), dtype=torch.bool, device=ref.device)
        present[self.segment[res], row[res]] = True
        scale, zero = key_stats(self.key_rows[None, :, :r], present[None], self.group, self.bits)
        g = self.key_scale.shape[1] + row // self.group
        self.key_scale = torch.cat([self.key_scale, scale[0]], 1)
        self.key_zero = torch.cat([self.key_zero, zero[0]], 1)
        self._encode_keys(res, _rows(self.key_rows, self.segment, row), g)
        ref.copy_(torch.where(res, g.int(), ref))
        self.base += r
        self._compact()

    def _encode_keys(self, where: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> None:
        """Key codes of ``x`` ``[total, d]`` with the scale and zero point of group rows ``g``
        ``[total]`` (clamped to the group's range), written to the slots ``where`` ``[total]``."""
        scale, zero = _rows(self.key_scale, self.segment, g), _rows(self.key_zero, self.segment, g)
        codes = q.pack(q.encode(x.to(self.dtype), scale, zero, self.bits), self.bits)
        buf = self.buffers["keys.codes"]
        buf.copy_(torch.where(where.unsqueeze(-1), codes, buf))

    def _compact(self) -> None:
        """Release the key group rows no held slot refers to (rows packed per segment)."""
        used, held, flat = self._referenced()
        keep = max(int(used.sum(-1).max()), 1)
        order = (~used).to(torch.uint8).argsort(dim=-1, stable=True)[:, :keep]
        new_index = torch.zeros(used.shape, dtype=torch.long, device=used.device)
        new_index.scatter_(1, order, torch.arange(keep, device=order.device).expand_as(order))
        index = order.unsqueeze(-1).expand(-1, -1, self.key_scale.shape[-1])
        self.key_scale, self.key_zero = self.key_scale.gather(1, index), self.key_zero.gather(1, index)
        ref = self.buffers["keys.ref"]
        ref.copy_(torch.where(held, new_index.view(-1)[flat].int(), ref))

    def write(self, name: str, value: torch.Tensor) -> None:
        """Set ``keys`` or ``values`` of the held slots to ``value`` ``[batch, kv_heads, n_slots,
        head_dim]`` (padding not read): residual slots get their row rewritten, quantized keys are
        encoded with their group's scale and zero point (clamped), quantized values per token."""
        valid = self.valid()
        at = (self.segment * self.n_slots + self.local).clamp(max=value[..., 0].numel() - 1)
        x = value.reshape(-1, value.shape[-1]).index_select(0, at).to(self.dtype)
        ref = self.buffers[f"{name}.ref"].long()
        res, quantized = valid & (ref < 0), valid & (ref >= 0)
        rows = self.key_rows if name == "keys" else self.value_rows
        flat = (self.segment * rows.shape[1] + (-1 - ref).clamp(0, rows.shape[1] - 1))[res]
        rows.view(-1, rows.shape[-1])[flat] = x[res]
        if name == "keys":
            self._encode_keys(quantized, x, ref.clamp(min=0))
            return
        new = value_codes(x, self.group, self.bits)
        for part, t in zip(("codes", "scale", "zero"), new, strict=True):
            buf = self.buffers[f"values.{part}"]
            buf.copy_(torch.where(quantized.unsqueeze(-1), t, buf))
