"""``quant=kivi2`` and ``quant=kivi4``: KIVI (Liu et al. ICML 2024, arXiv 2402.02750, Sec. 3.2 and
Algorithm 1): keys quantized per channel, values per token, the most recent tokens in full precision.

- Keys: tokens are quantized in blocks of ``residual`` (R) tokens, each block in groups of ``group``
  (G) consecutive tokens, one scale and zero point per channel and group (``X_K`` grouped along the
  token axis). The prompt's first ``L - L mod R`` tokens are quantized at once; the last ``L mod R``
  and every later token wait in the full-precision residual until it holds R tokens, then the block
  is quantized (the groups' statistics over the block's tokens still held by each head).
- Values: per token, in groups of G consecutive channels; the R most recent tokens in full precision,
  the oldest leaving it (quantized) when a new one arrives.

Storage (per slot and KV head): packed key and value codes, the value's scales and zero points, and
two int32 references: the key's group row (or its residual row) and the value's residual row (or
none). Side tables: key scales and zero points ``[batch, kv_heads, groups, head_dim]`` (only groups
some held slot refers to are counted as held; unreferenced rows are released when a block is
quantized and after a ``keep``), and the residual rows ``[batch, kv_heads, R + 1, head_dim]`` of keys
and ``[batch, kv_heads, R + 2, head_dim]`` of values in the model's dtype (one scratch row each).
A slot written after it was quantized (merging, key re-rotation) is re-quantized
(``methods.quant.kivi_writes``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from methods.quant import codes as q
from methods.quant.kivi_math import held_bytes, key_stats, value_codes
from methods.quant.kivi_ragged import KiviRaggedStore
from methods.quant.kivi_reads import KiviReads
from methods.quant.kivi_writes import KiviWrites
from methods.quant.registry import register_store
from methods.seam.uniform import SlotStore, slot_index

#: The paper's group size G and residual length R (Sec. 4.1: "group size 32, residual length 128").
GROUP, RESIDUAL = 32, 128


@register_store("kivi2", "kivi4")
class KiviStore(KiviReads, KiviWrites, SlotStore):
    """KIVI storage of keys and values (module docstring).

    Parameters
    ----------
    fills, capacity
        As :class:`~methods.seam.uniform.SlotStore`.
    bits : int
        Bits per code (2 or 4 in the paper).
    group : int
        G: tokens per key group, channels per value group (``head_dim`` when it is smaller).
    residual : int
        R: tokens held in full precision; a multiple of ``group``.

    Raises
    ------
    ValueError
        For a bit width the packing does not take, or R not a multiple of G.
    """

    code_fields = ("keys.codes", "keys.ref", "values.codes", "values.scale", "values.zero", "values.ref")

    def __init__(
        self,
        fills: dict[str, float],
        capacity: Callable[[int], int],
        bits: int = 2,
        group: int = GROUP,
        residual: int = RESIDUAL,
    ) -> None:
        q.check_bits(bits)
        if residual % group:
            raise ValueError(f"KIVI's residual length {residual} is not a multiple of its group size {group}")
        super().__init__(fills, capacity)
        self.shape: tuple[int, int, int] = (1, 1, 0)  # batch, kv_heads, head_dim
        self.bits, self.group, self.residual = bits, group, residual
        self.arrived = 0  # tokens appended so far (a token's arrival index is its residual row's key)
        self.base = 0  # arrivals whose keys are quantized: the key residual holds arrivals base..arrived-1
        # slot i holds arrival i (nothing evicted or moved): reads broadcast key groups (``KiviReads``)
        # and a value leaving the residual is written to its slot unsearched (``_append_one``)
        self.in_order = True

    # ------------------------------------------------------------------ allocation
    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, cap: int) -> None:
        """KIVI's per-slot fields and side tables for ``cap`` slots (first append).

        Raises
        ------
        ValueError
            If keys and values differ in head_dim.
        """
        if keys.shape[-1] != values.shape[-1]:
            raise ValueError("quantized storage needs keys and values of one head_dim")
        b, h, _, d = keys.shape
        self.dtype, self.shape, self.token = keys.dtype, (b, h, d), b * h * 2 * d * keys.element_size()
        self.kv_fields = self.code_fields
        width = d * self.bits // 8
        self.key_scale = keys.new_zeros((b, h, 1, d))
        self.key_zero = keys.new_zeros((b, h, 1, d))
        self.key_rows = keys.new_zeros((b, h, self.residual + 1, d))
        self.value_rows = keys.new_zeros((b, h, self.residual + 2, d))
        groups = d // q.group_size(d, self.group)
        u8, i32 = {"dtype": torch.uint8, "device": keys.device}, {"dtype": torch.int32, "device": keys.device}
        self.buffers = {
            "keys.codes": torch.empty((b, h, cap, width), **u8),
            "keys.ref": torch.empty((b, h, cap), **i32),
            "values.codes": torch.empty((b, h, cap, width), **u8),
            "values.scale": keys.new_empty((b, h, cap, groups)),
            "values.zero": keys.new_empty((b, h, cap, groups)),
            "values.ref": torch.empty((b, h, cap), **i32),
            "positions": torch.empty((b, h, cap), dtype=torch.long, device=keys.device),
        }
        for name in self.fills:
            self.buffers[name] = torch.empty((b, h, cap), dtype=torch.float32, device=keys.device)

    # ------------------------------------------------------------------ bytes
    def _referenced_groups(self, n: int | None = None) -> torch.Tensor:
        """``[batch, kv_heads, groups]`` bool: key groups one of the first ``n`` slots (default: the
        held ones) refers to."""
        ref = self.buffers["keys.ref"].narrow(2, 0, self.n if n is None else n).long()
        used = torch.zeros(self.key_scale.shape[:3], dtype=torch.long, device=ref.device)
        return used.scatter_add_(2, ref.clamp(min=0), (ref >= 0).long()) > 0

    def kv_bytes(self) -> int:
        """Bytes held: both references of every slot; the codes of quantized keys, the codes,
        scales and zero points of quantized values; the full-precision rows of residual keys and
        values; the scale and zero point rows of referenced key groups."""
        if not self.buffers:
            return 0
        size = self.key_rows.element_size()
        return held_bytes(
            self.view("keys.ref"),
            self.view("values.ref"),
            self.buffers["keys.codes"].shape[-1],
            2 * self.buffers["values.scale"].shape[-1] * size,
            self.shape[2] * size,
            int(self._referenced_groups().sum()),
        )

    def allocated_bytes(self) -> int:
        """Bytes of every buffer, capacity included, and of the key group tables and residual rows."""
        tables = (self.key_scale, self.key_zero, self.key_rows, self.value_rows) if self.buffers else ()
        return super().allocated_bytes() + sum(t.untyped_storage().nbytes() for t in tables)

    # ------------------------------------------------------------------ writing
    def _value_codes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return value_codes(x.to(self.dtype), self.group, self.bits)

    def _key_codes(self, x: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """Packed codes of keys ``x`` ``[b, h, k, d]`` with the scale and zero point of their key
        group rows ``group`` ``[b, h, k]`` (clamped to the group's range)."""
        scale, zero = q.rows(self.key_scale, self.key_zero, index=group)
        return q.pack(q.encode(x.to(self.dtype), scale, zero, self.bits), self.bits)

    def _key_stats(self, x: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return key_stats(x, present, self.group, self.bits)

    def count_ahead(self, k: int, grows: bool) -> None:
        """Nothing: KIVI's residual arithmetic counts on the host (the compiled step of a growing layer
        is recompiled as its counts change)."""

    def _append_kv(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.n == 0 and self.arrived == 0:
            self._prefill(keys, values)
            return
        for i in range(keys.shape[2]):
            self._append_one(keys[:, :, i : i + 1], values[:, :, i : i + 1], self.n + i)

    def _prefill(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Algorithm 1's prefill: the first ``L - L mod R`` keys and ``L - R`` values quantized."""
        b, h, L = keys.shape[:3]
        r = self.residual
        nq = L - L % r
        g = torch.arange(L, device=keys.device) // self.group
        if nq:
            ones = keys.new_ones((b, h, nq), dtype=torch.bool)
            self.key_scale, self.key_zero = self._key_stats(keys[:, :, :nq], ones)
            self.buffers["keys.codes"][:, :, :nq] = self._key_codes(keys[:, :, :nq], g[:nq].expand(b, h, nq))
        self.key_rows[:, :, : L - nq] = keys[:, :, nq:]
        arrival = torch.arange(L, device=keys.device, dtype=torch.int32)
        self.buffers["keys.ref"][:, :, :L] = torch.where(arrival < nq, g.int(), nq - 1 - arrival)
        nv = max(L - r, 0)
        for part, t in zip(("codes", "scale", "zero"), self._value_codes(values), strict=True):
            self.buffers[f"values.{part}"][:, :, :L] = t
        row = arrival % (r + 1)
        self.value_rows[:, :, row[nv:].long()] = values[:, :, nv:]
        self.buffers["values.ref"][:, :, :L] = torch.where(arrival < nv, 0, -1 - row)
        self.arrived, self.base = L, nq

    def _append_one(self, key: torch.Tensor, value: torch.Tensor, slot: int) -> None:
        """One decode step's token at ``slot``: into both residuals; the value that leaves the
        value residual is quantized; a full key residual is quantized as one block."""
        r, t = self.residual, self.arrived
        n = slot + 1
        if t >= r:  # arrival t - r leaves the value residual
            row = (t - r) % (r + 1)
            codes = self._value_codes(self.value_rows[:, :, row : row + 1])
            quantized = zip(("codes", "scale", "zero"), codes, strict=True)
            if self.in_order:  # it sits in slot t - r of every head
                for part, new in quantized:
                    self.buffers[f"values.{part}"][:, :, t - r] = new[:, :, 0]
                self.buffers["values.ref"][:, :, t - r] = 0
            else:
                ref = self.buffers["values.ref"].narrow(2, 0, n)
                # at most one slot per head holds it (none where it was evicted); where a head no longer
                # holds it, the codes land in ``slot`` (a residual value: unread)
                found, at = (ref == -1 - row).max(-1, keepdim=True)
                at = torch.where(found, at, slot)
                for part, new in quantized:
                    buf = self.buffers[f"values.{part}"]
                    buf.scatter_(2, slot_index(buf, at), new)
                ref.scatter_(2, at, 0)
        self.key_rows[:, :, t - self.base] = key[:, :, 0]
        self.value_rows[:, :, t % (r + 1)] = value[:, :, 0]
        self.buffers["keys.ref"][:, :, slot] = self.base - 1 - t
        self.buffers["values.ref"][:, :, slot] = -1 - t % (r + 1)
        self.arrived = t + 1
        if self.arrived - self.base == r:
            self._flush(n)

    def _flush(self, n: int) -> None:
        """Quantize the full key residual as one block of R tokens (module docstring)."""
        r = self.residual
        ref = self.buffers["keys.ref"].narrow(2, 0, n)
        res = ref < 0
        row = (-1 - ref.long()).clamp(min=0)
        present = torch.zeros((*ref.shape[:2], r + 1), dtype=torch.bool, device=ref.device)
        present.scatter_(2, torch.where(res, row, r), True)
        scale, zero = self._key_stats(self.key_rows[:, :, :r], present[:, :, :r])
        first = self.key_scale.shape[2]
        self.key_scale = torch.cat([self.key_scale, scale], 2)
        self.key_zero = torch.cat([self.key_zero, zero], 2)
        g = first + row // self.group
        codes = self._key_codes(q.rows(self.key_rows, index=row)[0], g)
        packed = self.buffers["keys.codes"].narrow(2, 0, n)
        packed.copy_(torch.where(res.unsqueeze(-1), codes, packed))
        ref.copy_(torch.where(res, g.int(), ref))
        self.base += r
        self._compact(n)

    def _compact(self, n: int | None = None) -> None:
        """Release the key group rows none of the first ``n`` slots (default: the held ones) refers
        to (rows packed per head, the table as long as the head that refers to most)."""
        n = self.n if n is None else n
        used = self._referenced_groups(n)
        keep = max(int(used.sum(-1).max()), 1)
        order = (~used).to(torch.uint8).argsort(dim=-1, stable=True)[..., :keep]
        new_index = torch.zeros(used.shape, dtype=torch.long, device=used.device)
        new_index.scatter_(2, order, torch.arange(keep, device=order.device).expand_as(order))
        self.key_scale, self.key_zero = q.rows(self.key_scale, self.key_zero, index=order)
        ref = self.buffers["keys.ref"].narrow(2, 0, n)
        ref.copy_(torch.where(ref >= 0, new_index.gather(2, ref.long().clamp(min=0)).int(), ref))

    def keep(self, index: torch.Tensor) -> None:
        """``SlotStore.keep``, then the key groups no kept slot refers to released."""
        super().keep(index)
        self._compact()

    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> KiviRaggedStore:
        """``SlotStore.ragged`` over KIVI's fields: the kept slots' codes and references packed per head
        as they are, the side tables per segment (``methods.quant.kivi_ragged``)."""
        room = self.capacity_for(self.n + 1) - self.n
        fields = {name: self.view(name) for name in (*self.code_fields, "positions")}
        return KiviRaggedStore.from_mask(fields, keep, room, bounds, source=self)
