"""The uniform layout of one decoder layer's slots: fixed-capacity buffers for every per-slot tensor
(``methods.seam.buffers``) and a handful of operations, the only code that writes them (docs/design.md,
"The slot store").

Every per-slot tensor (``keys``, ``values``, ``log_weight``, ``positions`` and the method's
state, e.g. scores or fusion counts) lives in one buffer ``[batch, kv_heads, capacity, *extra]``
whose first ``n`` slots are valid; the same ``n`` for every head. Readers get views of the valid
slots (:meth:`SlotStore.view`). Capacity comes from the owner's rule (``CompressedLayer``:
the method's per-layer bound plus the slot a decode step appends before it evicts), so once a
layer is full every decode step sees the same shapes: append makes ``n = bound + 1``, the
eviction brings it back to ``bound``, in place, with no allocation and no host synchronisation.

Operations: :meth:`~SlotStore.append` (the seam's, one call per forward), :meth:`~SlotStore.keep`
(per-head selection, releasing the old buffers), :meth:`~SlotStore.drop` (evict one slot per head:
the last slot moves into its place), :meth:`~SlotStore.swap`, :meth:`~SlotStore.replace` (write
given fields at given slots), :meth:`~SlotStore.merge_into` (weighted mean of a slot into another),
:meth:`~SlotStore.write` (a field over all valid slots) and :meth:`~SlotStore.reset` (replace every
slot at once by compact tensors: merge rebuilds). Slot order is not position order; methods find
tokens by ``positions``. Keys and values are held by the store's codec (``methods.seam.storage``):
as themselves, or as its code fields, each a buffer like any other, so the operations that move slots
move codes as they are (a token is encoded once); reads decode, writes of keys or values encode. One
write bypasses these operations by design: a method with a fused score
update (``Traits.score_decay``) has the decode attention update its ``scores`` view in place
(the Triton kernel's ``s <- lambda s + a``), on the valid slots only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels import decode_attention
from kernels.decode_attention import masked_sdpa
from methods.seam.buffers import SlotBuffers
from methods.seam.ragged import RaggedStore
from methods.seam.slots import gather_slots, memo_slot_index, slot_index
from methods.seam.storage import KV, MergingStorage

if TYPE_CHECKING:
    from methods.seam.traits import Traits

#: Fields whose dtype the store fixes (values given to :meth:`SlotStore.reset` are cast).
FIXED_DTYPES = ("keys", "values", "log_weight", "positions")


class SlotStore(SlotBuffers, MergingStorage):
    """The uniform store (module docstring): :class:`~methods.seam.buffers.SlotBuffers` with the
    methods' operations, the swap to ragged heads and decode attention. Parameters and attributes:
    :class:`~methods.seam.buffers.SlotBuffers`."""

    kind = "uniform"

    # ------------------------------------------------------------------ methods' operations
    def keep(self, index: torch.Tensor) -> None:
        """Keep the slots ``index`` ``[batch, kv_heads, k]`` (per head, in that order) and free the
        rest: new buffers sized for ``k`` slots plus a decode step's append, the old ones released;
        in place when the buffers already have that size (a compression between decode steps, R-KV:
        no allocation inside a compiled step)."""
        k = index.shape[2]
        cap = max(self.capacity_for(k + 1), k)
        if cap == self.capacity:
            for buf in self.buffers.values():
                buf.narrow(2, 0, k).copy_(gather_slots(buf.narrow(2, 0, self.n), index))
            self.n = k
            return
        new = {}
        for name, buf in self.buffers.items():
            new[name] = buf.new_empty((*buf.shape[:2], cap, *buf.shape[3:]))
            new[name][:, :, :k] = gather_slots(buf[:, :, : self.n], index)
        self.buffers, self.n = new, k

    def drop(self, slot: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """Evict one slot per head, ``slot`` ``[batch, kv_heads]`` int64, in place: the last valid
        slot moves into its place (O(1) per head; no copy of the cache, no host synchronisation).

        Raises
        ------
        ValueError
            For ``active``: the heads of a uniform store hold the same count (a head-adaptive rule
            makes the store ragged first).
        """
        if active is not None:
            raise ValueError("a uniform store drops one slot in every head (make it ragged first)")
        last, victim, memo = self.n - 1, slot.unsqueeze(-1), {}
        for buf in self.buffers.values():
            at = memo_slot_index(memo, buf, victim)
            buf.scatter_(2, at, buf.narrow(2, last, 1).clone())  # scatter_ refuses an overlapping src in
            # older torch and other backends (at::assert_no_overlap); the victim may be last
        self.n = last

    def swap(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Exchange slots ``a`` and ``b`` ``[batch, kv_heads]`` int64 of every head, in place."""
        ia, ib = a.unsqueeze(-1), b.unsqueeze(-1)
        for buf in self.buffers.values():
            xa, xb = gather_slots(buf, ia), gather_slots(buf, ib)
            buf.scatter_(2, slot_index(buf, ia), xb)
            buf.scatter_(2, slot_index(buf, ib), xa)

    def replace(self, slot: torch.Tensor, **fields: torch.Tensor | float) -> None:
        """Write ``fields`` at ``slot`` ``[batch, kv_heads, k]`` int64: each a tensor
        ``[batch, kv_heads, k, *extra]`` (cast to the field's dtype; keys and values held as codes:
        encoded) or a scalar."""
        memo: dict = {}
        for name, value in fields.items():
            if name not in self.buffers:
                self._put(name, slot, value)
                continue
            buf = self.buffers[name]
            at = memo_slot_index(memo, buf, slot)
            if isinstance(value, torch.Tensor):
                buf.scatter_(2, at, value if value.dtype == buf.dtype else value.to(buf.dtype))
            else:
                buf.scatter_(2, at, torch.full_like(gather_slots(buf, slot), value))

    def _put(self, name: str, slot: torch.Tensor | None, value: torch.Tensor) -> None:
        """Encode and write ``value`` ``[batch, kv_heads, k, head_dim]`` as keys or values held as
        codes at ``slot`` ``[batch, kv_heads, k]`` (None: every valid slot, ``k = n``; a code field
        whose trailing shape changes then gets a new buffer, as in :meth:`write`)."""
        for field, t in self.codec.encode(name, value.to(self.dtype)).items():
            buf = self.buffers[field]
            if slot is None and buf.shape[3:] != t.shape[3:]:  # a codec of another width (ThinK)
                buf = self.buffers[field] = t.new_zeros((*buf.shape[:3], *t.shape[3:]))
            if slot is None:
                buf.narrow(2, 0, self.n).copy_(t)
            else:
                buf.scatter_(2, slot_index(buf, slot), t)

    def merge_into(
        self,
        target: torch.Tensor,
        source: torch.Tensor,
        weight_target: torch.Tensor,
        weight_source: torch.Tensor,
        fields: tuple[str, ...] = KV,
    ) -> None:
        """Replace slot ``target`` by the weighted mean of ``target`` and ``source`` for each field:
        ``(w_t x_t + w_s x_s) / (w_t + w_s)``, in float32 or better (ZSMerge Eq. 7's incremental
        mean with fusion counts as weights); keys and values held as codes: the mean of the decoded
        slots, encoded. ``target``, ``source``, ``weight_*`` are ``[batch, kv_heads, 1]``; the source
        slot is left as it is (evict it after)."""
        total = weight_target + weight_source
        for name in fields:
            if name not in self.buffers:
                full = self.view(name).float()
                w_t = (weight_target.float() / total.float()).unsqueeze(-1)
                mean = w_t * gather_slots(full, target) + (1 - w_t) * gather_slots(full, source)
                self._put(name, target, mean)
                continue
            buf = self.buffers[name]
            acc = torch.promote_types(buf.dtype, torch.float32)
            x_t, x_s = gather_slots(buf, target).to(acc), gather_slots(buf, source).to(acc)
            w_t = (weight_target.to(acc) / total.to(acc)).view(*target.shape, *([1] * (buf.dim() - 3)))
            w_s = (weight_source.to(acc) / total.to(acc)).view(*target.shape, *([1] * (buf.dim() - 3)))
            buf.scatter_(2, slot_index(buf, target), (w_t * x_t + w_s * x_s).to(buf.dtype))

    def write(self, name: str, value: torch.Tensor) -> None:
        """Set field ``name`` over all valid slots to ``value`` ``[batch, kv_heads, n, *extra]`` (keys
        and values held as codes: encoded); a field whose trailing shape changes (a method's state
        sized at prefill) gets a new buffer."""
        if name not in self.buffers:
            self._put(name, None, value)
            return
        buf = self.buffers[name]
        if buf.shape[3:] != value.shape[3:] or buf.dtype != value.dtype:
            buf = self.buffers[name] = value.new_empty((*buf.shape[:3], *value.shape[3:]))
        buf[:, :, : self.n] = value

    def reset(self, **fields: torch.Tensor) -> None:
        """Replace every slot at once by compact tensors ``[batch, kv_heads, k, *extra]`` (merge
        rebuilds: ZSMerge's residual slots, KVMerger's sets, KeepKV's groups); keys and values held
        as codes are encoded afresh (:meth:`_encode_all`); fields not given take their fill value
        (positions: -1). New buffers sized for ``k`` slots plus an append."""
        k = fields["keys"].shape[2]
        if "keys" not in self.buffers:
            keys, values = fields.pop("keys"), fields.pop("values")
            fields = self._encode_all(keys, values, fields.get("positions")) | fields
        cap = max(self.capacity_for(k + 1), k)
        new = {}
        for name, buf in self.buffers.items():
            value = fields.get(name)
            extra = buf.shape[3:] if value is None else value.shape[3:]
            dtype = buf.dtype if value is None or name in FIXED_DTYPES else value.dtype
            new[name] = torch.empty((*buf.shape[:2], cap, *extra), dtype=dtype, device=buf.device)
            new[name][:, :, :k] = value if value is not None else self.fills.get(name, -1)
        self.buffers, self.n = new, k

    def _encode_all(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """The codec's fields ``[batch, kv_heads, k, *extra]`` of a compact set of ``k`` slots
        (:meth:`reset`; ``positions`` for a stateful codec)."""
        return self._encode(keys, values)

    # ------------------------------------------------------------------ layouts and attention
    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> RaggedStore:
        """The slots ``keep`` ``[batch, kv_heads, slots]`` (bool) selects, packed per head in a
        :class:`~methods.seam.ragged.RaggedStore` holding this codec (``bounds`` as there); codes are
        packed as they are (no token is encoded twice), with room for what the owner's capacity rule
        says an unbounded layer will still receive. Method state is not carried over."""
        room = self.capacity_for(self.n + 1) - self.n
        fields = {name: self.view(name) for name in (*self.kv_fields, "positions")}
        kind = {"codec": self.codec, "token": self.token, "dtype": self.dtype}
        return RaggedStore.from_mask(fields, keep, room, bounds, **kind)

    def attend(
        self, query: torch.Tensor, scaling: float, traits: Traits, softcap: float | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode attention over the slots (``SlotStorage.attend``): fused SDPA when the method needs
        nothing back, no bias and no soft-cap; otherwise ``kernels.decode_attention`` with the bias,
        returning the group-mean probabilities or the logits, with the ``score_decay`` update fused
        into the ``scores`` field (the one write outside the store's operations). A growing layer's
        compiled step (:meth:`count_ahead`) attends over the whole capacity, the slots past ``count``
        masked (-inf logits)."""
        needs, valid, read = traits.needs, None, self.view
        if self.count is not None and torch.compiler.is_compiling():  # nothing asked back: needs none
            valid = torch.arange(self.capacity, device=query.device).view(1, 1, -1) < self.count
            read = self._whole
        keys, values = read("keys"), read("values")
        if needs == "none" and not traits.uses_log_weight and softcap is None:
            return masked_sdpa(query, keys, values, valid, scaling), None
        bias = read("log_weight") if traits.uses_log_weight or valid is not None else None
        decay = traits.score_decay if needs == "probs" else None
        fused = None if decay is None else self.view("scores")  # updated in place
        out, scores = decode_attention(
            query,
            keys,
            values,
            bias if valid is None else torch.where(valid, bias, float("-inf")),
            scaling,
            return_logits=needs == "logits",
            scores=fused,
            decay=1.0 if decay is None else decay,
            softcap=softcap,
        )
        return out, None if needs == "none" or fused is not None else scores
