"""``quant=quanto_int4`` and ``quant=quanto_int2``: transformers' ``QuantizedCache`` with the quanto
backend (``QuantoQuantizedLayer`` and ``QuantizedLayer.update``, transformers 5.24 ``cache_utils``), its
full-precision residual and flush rule included: FullKV reproduces
``model.generate(cache_implementation="quantized", cache_config={"backend": "quanto", ...})`` token for
token (tests/test_quanto_cache.py, scripts/quanto_tokens.py).

transformers' rule, for a residual length R (``residual_length``, default 128):

- the prompt is quantized at once (its own attention ran in full precision); the residual is empty;
- a later forward of k tokens attends over the dequantized tokens, the residual's r tokens and its own
  k tokens in full precision; then, if ``r + k >= R``, every token is quantized anew from what it
  just attended over (the quantized ones re-quantized from their dequantized values) and the residual
  is emptied; otherwise the k tokens join the residual (R = 0 acts as R = 1).

Here the flush waits for the next append (the reads in between are the same): an append first flushes
if the previous one reached R, then writes its tokens into the residual. Codes: per token in groups of
``group`` consecutive channels, asymmetric min/max (quanto's ``MaxOptimizer`` and ``quantize_affine``
with ``axis=0``, whose groups run along the contiguous ``[batch, kv_heads, seq, head_dim]``: per token
when ``group`` divides ``head_dim``): ``methods.quant.per_token.PerTokenCodec``, bit-identical to
quanto's quantize and dequantize (tested).

Storage per slot and KV head: the per-token codes, scales and zero points of key and value, and an
int32 ``residual`` field, the slot's row in the residual tables (-1: quantized). Side tables
``[batch, kv_heads, rows, head_dim]`` of residual keys and values in the model's dtype (R rows; more
while a longer chunk waits). Ragged heads (:class:`QuantoRaggedStore`) pack the per-slot fields and
keep the tables per segment; every segment receives every token, so one residual count serves all.
Keys or values a method writes (merging, key re-rotation) are encoded, and a residual slot's row
rewritten; a merge rebuild (``reset``) quantizes its slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from methods.quant import codes as q
from methods.quant.per_token import GROUP, PerTokenCodec
from methods.quant.registry import register_store
from methods.seam.ragged import RaggedStore
from methods.seam.slots import gather_slots
from methods.seam.storage import KV
from methods.seam.uniform import SlotStore

#: transformers' ``QuantizedLayer`` default ``residual_length``.
RESIDUAL = 128
#: The bit widths quanto's ``QuantoQuantizedLayer`` takes.
QUANTO_BITS = (2, 4)
#: The per-slot field of a slot's residual row (-1: quantized).
ROW = "residual"


def check_params(bits: int, group: int, residual: int) -> None:
    """Raise ``ValueError`` for a bit width quanto does not take, a group < 1 or a residual < 0."""
    if bits not in QUANTO_BITS:
        raise ValueError(f"quanto's QuantizedCache takes {QUANTO_BITS} bits, got {bits}")
    if group < 1 or residual < 0:
        raise ValueError(f"quanto kinds take group >= 1 and residual >= 0, got {group} and {residual}")


def check_head_dim(head_dim: int, group: int) -> None:
    """Raise ``ValueError`` unless ``group`` divides ``head_dim`` (wider groups span tokens in quanto)."""
    if head_dim % group:
        raise ValueError(
            f"quanto groups {group} consecutive elements of [batch, kv_heads, seq, head_dim]: per token only "
            f"when the group divides head_dim {head_dim}"
        )


@register_store("quanto_int4", "quanto_int2")
class QuantoStore(SlotStore):
    """transformers' quanto ``QuantizedCache`` as a uniform store (module docstring).

    Parameters
    ----------
    fills, capacity
        As :class:`~methods.seam.uniform.SlotStore`.
    bits : int
        Bits per code (``nbits``: 2 or 4).
    group : int
        Channels sharing a scale and zero point (``q_group_size``); must divide ``head_dim``.
    residual : int
        R (``residual_length``): tokens held in full precision until the flush.

    Raises
    ------
    ValueError
        As :func:`check_params`; at the first append, as :func:`check_head_dim`.
    """

    def __init__(
        self,
        fills: dict[str, float],
        capacity: Callable[[int], int],
        bits: int = 4,
        group: int = GROUP,
        residual: int = RESIDUAL,
    ) -> None:
        check_params(bits, group, residual)
        super().__init__(fills, capacity, codec=PerTokenCodec(bits, group))
        self.bits, self.group, self.residual = bits, group, residual
        self.used = 0  # residual rows written since the last flush
        self.pending = False  # the last append reached R: the next one flushes first
        self.started = False  # the prompt (the first append) is quantized at once
        self.key_rows = self.value_rows = torch.empty(0)

    # ------------------------------------------------------------------ allocation and bytes
    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, cap: int) -> None:
        check_head_dim(keys.shape[-1], self.group)
        super()._allocate(keys, values, cap)
        b, h, _, d = keys.shape
        self.buffers[ROW] = torch.empty((b, h, cap), dtype=torch.int32, device=keys.device)
        self.kv_fields = (*self.kv_fields, ROW)
        self.key_rows = keys.new_zeros((b, h, max(self.residual, 1), d))
        self.value_rows = torch.zeros_like(self.key_rows)

    def kv_bytes(self) -> int:
        """Bytes held (:func:`held_bytes` over the held slots' residual rows)."""
        if not self.buffers:
            return 0
        return held_bytes(self.view(ROW), self._code_bytes(), 2 * self.key_rows[0, 0, 0].nbytes)

    def _code_bytes(self) -> int:
        return sum(self.buffers[f][0, 0, 0].nbytes for f in self.kv_fields if f != ROW)

    def allocated_bytes(self) -> int:
        """Bytes of every buffer, capacity included, and of the residual tables."""
        tables = (self.key_rows, self.value_rows) if self.buffers else ()
        return super().allocated_bytes() + sum(t.untyped_storage().nbytes() for t in tables)

    # ------------------------------------------------------------------ reading
    def _read(self, name: str, whole: bool = False) -> torch.Tensor:
        """Keys or values dequantized, residual slots read from their full-precision rows."""
        out = super()._read(name, whole)
        if not self.used:
            return out
        ref = (self.buffers[ROW] if whole else self.view(ROW)).long()
        rows = q.rows(self.key_rows if name == "keys" else self.value_rows, index=ref.clamp(min=0))[0]
        return torch.where((ref >= 0).unsqueeze(-1), rows, out)

    # ------------------------------------------------------------------ writing
    def _append_kv(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The first append (the prompt) quantized; later ones into the residual after a due flush."""
        n, k = self.n, keys.shape[2]
        if not self.started:
            self.started = True
            super()._append_kv(keys, values)
            self.buffers[ROW].narrow(2, n, k).fill_(-1)
            return
        if self.pending:
            self._flush()
        super()._append_kv(keys, values)  # codes, rewritten by the flush
        self.key_rows, self.value_rows = grown(self.key_rows, self.value_rows, self.used + k)
        self.key_rows[:, :, self.used : self.used + k] = keys
        self.value_rows[:, :, self.used : self.used + k] = values
        rows = torch.arange(self.used, self.used + k, dtype=torch.int32, device=keys.device)
        self.buffers[ROW].narrow(2, n, k).copy_(rows)
        self.used += k
        self.pending = self.used >= self.residual

    def _flush(self) -> None:
        """transformers' flush: every held slot quantized from what it reads (residual rows, or its
        dequantized codes re-quantized); the residual emptied."""
        full = {name: self._read(name) for name in KV}
        for name, x in full.items():
            for field, t in self.codec.encode(name, x).items():
                self.buffers[field].narrow(2, 0, self.n).copy_(t)
        self.buffers[ROW].narrow(2, 0, self.n).fill_(-1)
        self.used, self.pending = 0, False

    def _put(self, name: str, slot: torch.Tensor | None, value: torch.Tensor) -> None:
        """``SlotStore._put``, and the rows of residual slots rewritten in full precision."""
        super()._put(name, slot, value)
        if not self.used:
            return
        ref = self.view(ROW) if slot is None else gather_slots(self.buffers[ROW], slot)
        b, h, j = (ref >= 0).nonzero(as_tuple=True)
        table = self.key_rows if name == "keys" else self.value_rows
        table[b, h, ref[b, h, j].long()] = value[b, h, j].to(table.dtype)

    # ------------------------------------------------------------------ layouts
    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> QuantoRaggedStore:
        """``SlotStore.ragged`` over the per-slot fields (codes and residual rows packed as they are),
        the residual tables per segment (:class:`QuantoRaggedStore`)."""
        room = self.capacity_for(self.n + 1) - self.n
        fields = {name: self.view(name) for name in (*self.kv_fields, "positions")}
        kind = {"codec": self.codec, "token": self.token, "dtype": self.dtype}
        return QuantoRaggedStore.from_mask(fields, keep, room, bounds, source=self, **kind)


class QuantoRaggedStore(RaggedStore):
    """Ragged heads over :class:`QuantoStore` (module docstring): the per-slot fields packed, residual
    tables ``[segments, rows, head_dim]``, the same flush rule per segment.

    Parameters
    ----------
    *layout, **kind
        As :class:`~methods.seam.ragged.RaggedStore` takes them; ``buffers`` holds the codec's fields,
        ``residual`` and ``positions``.
    source : QuantoStore
        The uniform store the slots come from: its residual length, count and tables (copied).
    """

    def __init__(self, *layout: Any, source: QuantoStore, **kind: Any) -> None:
        super().__init__(*layout, **kind)
        self.residual, self.used, self.pending = source.residual, source.used, source.pending
        s, d = len(self.offsets), source.key_rows.shape[-1]
        self.key_rows = source.key_rows.reshape(s, -1, d).clone()
        self.value_rows = source.value_rows.reshape(s, -1, d).clone()

    def _packed(self, name: str) -> torch.Tensor:
        """Keys or values dequantized over the whole buffer ``[total, head_dim]``, residual slots read
        from their rows; other fields as they are."""
        out = super()._packed(name)
        if name not in KV or not self.used:
            return out
        ref = self.buffers[ROW].long()
        table = self.key_rows if name == "keys" else self.value_rows
        s, r, d = table.shape
        rows = table.reshape(s * r, d).index_select(0, self.segment * r + ref.clamp(0, r - 1))
        return torch.where((ref >= 0).unsqueeze(-1), rows, out)

    def kv_bytes(self) -> int:
        """Bytes held (:func:`held_bytes` over the held slots of every segment)."""
        code = sum(self.buffers[f][0].nbytes for f in self.kv_fields if f != ROW)
        return held_bytes(self.buffers[ROW][self.valid()], code, 2 * self.key_rows[0, 0].nbytes)

    def allocated_bytes(self) -> int:
        """``RaggedStore.allocated_bytes`` plus the residual tables."""
        tables = (self.key_rows, self.value_rows)
        return super().allocated_bytes() + sum(t.untyped_storage().nbytes() for t in tables)

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """One token ``[batch, kv_heads, 1, head_dim]`` into every segment's residual, after a due
        flush (module docstring); room as ``RaggedStore.append``."""
        if self.pending:
            self._flush()
        super().append(keys, values, positions)
        at = self.offsets + self.lengths - 1
        self.key_rows, self.value_rows = grown(self.key_rows, self.value_rows, self.used + 1, dim=1)
        self.key_rows[:, self.used] = keys.reshape(len(at), -1)
        self.value_rows[:, self.used] = values.reshape(len(at), -1)
        self.buffers[ROW].index_fill_(0, at, self.used)
        self.used += 1
        self.pending = self.used >= self.residual

    def _flush(self) -> None:
        """``QuantoStore._flush`` over the packed buffer."""
        full = {name: self._packed(name) for name in KV}
        for name, x in full.items():
            for field, t in self.codec.encode(name, x).items():
                self.buffers[field].copy_(t)
        self.buffers[ROW].fill_(-1)
        self.used, self.pending = 0, False

    def write(self, name: str, value: torch.Tensor) -> None:
        """``RaggedStore.write``, and the rows of residual slots rewritten in full precision."""
        super().write(name, value)
        valid = self.valid()
        ref, segment = self.buffers[ROW][valid].long(), self.segment[valid]
        x = value.reshape(-1, value.shape[-1])[(self.segment * self.n_slots + self.local)[valid]]
        table = self.key_rows if name == "keys" else self.value_rows
        s, r, d = table.shape
        res = ref >= 0
        table.view(s * r, d)[segment[res] * r + ref[res]] = x[res].to(table.dtype)


def grown(
    keys: torch.Tensor, values: torch.Tensor, rows: int, dim: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual tables ``keys``/``values`` with at least ``rows`` rows along ``dim`` (zeros added)."""
    more = rows - keys.shape[dim]
    if more <= 0:
        return keys, values
    pad = list(keys.shape)
    pad[dim] = more
    return tuple(torch.cat([t, t.new_zeros(pad)], dim) for t in (keys, values))


def held_bytes(ref: torch.Tensor, code: int, row: int) -> int:
    """Bytes of held slots whose residual rows are ``ref`` (any shape, -1: quantized): ``code`` bytes
    (codes, scales, zero points of key and value) per quantized slot, ``row`` bytes (a key and a value
    in the model's dtype) per residual slot, and the int32 row of every slot."""
    residual = int((ref >= 0).sum())
    return (ref.numel() - residual) * code + residual * row + ref.numel() * ref.element_size()
