"""The uniform layout of one decoder layer's slots: fixed-capacity buffers for every per-slot tensor
and a handful of operations, the only code that writes them (docs/design.md, "The slot store").

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

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kernels import decode_attention
from kernels.decode_attention import masked_sdpa
from methods.seam.ragged import RaggedStore
from methods.seam.slots import gather_slots, memo_slot_index, slot_index
from methods.seam.storage import KV, PLAIN, Codec, MergingStorage

if TYPE_CHECKING:
    from methods.seam.traits import Traits

#: Fields every store has, besides the method's state: name -> fill of slots appended by the seam.
BASE_FILLS = {"log_weight": 0.0}
#: Fields whose dtype the store fixes (values given to :meth:`SlotStore.reset` are cast).
FIXED_DTYPES = ("keys", "values", "log_weight", "positions")


class SlotStore(MergingStorage):
    """Fixed-capacity slot buffers of one layer (module docstring).

    Parameters
    ----------
    fills : dict[str, float]
        The method's state fields and the value a slot appended by the seam starts with
        (``Traits.state_fill``); ``log_weight`` (0) is always present.
    capacity : Callable[[int], int]
        Slots to allocate for a buffer that must hold ``needed`` slots (the owner's rule).
    codec : Codec
        How keys and values are held (default: as they are).

    Attributes
    ----------
    n : int
        Valid slots per (batch, KV head).
    buffers : dict[str, torch.Tensor]
        ``[batch, kv_heads, capacity, *extra]`` per field: ``keys``/``values`` (or the codec's fields),
        ``log_weight`` and method state float32, ``positions`` int64.
    kv_fields : tuple[str, ...]
        The buffers holding keys and values (counted as key/value bytes); set by the first append.
    dtype : torch.dtype | None
        The model's dtype of keys and values (set by the first append).
    count : torch.Tensor | None
        ``[]`` int64 on the buffers' device: the valid slots, kept by the compiled steps of a growing
        layer (:meth:`count_ahead`); None until its first.
    """

    kind = "uniform"

    def __init__(self, fills: dict[str, float], capacity: Callable[[int], int], codec: Codec = PLAIN) -> None:
        self.fills = BASE_FILLS | dict(fills)
        self.capacity_for, self.codec = capacity, codec
        self.buffers: dict[str, torch.Tensor] = {}
        self.n, self.token, self.kv_fields = 0, 0, KV
        self.dtype: torch.dtype | None = None
        self.count: torch.Tensor | None = None
        self._ahead, self._synced = 0, -1  # slots counted ahead; ``n`` when ``count`` was last right

    # ------------------------------------------------------------------ reading
    @property
    def n_slots(self) -> int:
        """Valid slots per (batch, KV head)."""
        return self.n

    def view(self, name: str) -> torch.Tensor:
        """The valid slots of field ``name``: ``[batch, kv_heads, n, *extra]`` (a view; keys and values
        held as codes: decoded, a new tensor in the model's dtype).

        Raises
        ------
        KeyError
            For a field the store does not hold, or before the first append.
        """
        if name in self.buffers:
            return self.buffers[name].narrow(2, 0, self.n)
        if name in KV and self.buffers:
            return self._read(name)
        raise KeyError(f"the layer holds no {name!r} (fields: {sorted(self.buffers) or 'none yet'})")

    def _read(self, name: str, whole: bool = False) -> torch.Tensor:
        """Keys or values held as codes, decoded: ``[batch, kv_heads, n, head_dim]`` (model dtype);
        ``whole``: over every slot of the capacity."""
        fields = {
            f: self.buffers[f] if whole else self.view(f) for f in self.kv_fields if f.startswith(f"{name}.")
        }
        return self.codec.decode(name, fields).to(self.dtype)

    def _whole(self, name: str) -> torch.Tensor:
        """Field ``name`` over every slot of the capacity, valid or not: ``[batch, kv_heads, capacity,
        *extra]`` (keys and values held as codes: decoded)."""
        return self.buffers[name] if name in self.buffers else self._read(name, whole=True)

    def state_names(self) -> tuple[str, ...]:
        """The method's state fields (``Traits.state_fill``)."""
        return tuple(name for name in self.fills if name != "log_weight")

    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]`` int64, every head ``n``."""
        b, h = self.buffers["positions"].shape[:2] if self.buffers else (1, 1)
        return torch.full((b, h), self.n, dtype=torch.long)

    @property
    def capacity(self) -> int:
        """Slots the buffers hold (valid or not)."""
        return self.buffers["positions"].shape[2] if self.buffers else 0

    def tensors(self) -> list[torch.Tensor]:
        """The buffers, and the device count of a growing layer's compiled steps (:meth:`count_ahead`)."""
        return [*self.buffers.values(), *([] if self.count is None else [self.count])]

    def allocated_bytes(self) -> int:
        """Bytes of every buffer, capacity included."""
        return sum(buf.untyped_storage().nbytes() for buf in self.buffers.values())

    def kv_bytes(self) -> int:
        """Bytes of the held slots' keys and values (or their codes)."""
        return sum(self.buffers[f].narrow(2, 0, self.n).nbytes for f in self.kv_fields if f in self.buffers)

    def state_bytes(self) -> int:
        """Bytes of the held slots' bias, positions and method state."""
        names = [name for name in self.buffers if name not in self.kv_fields]  # none before an append
        return sum(self.view(name).numel() * self.buffers[name].element_size() for name in names)

    def token_bytes(self) -> int:
        """Key + value bytes of one token in the model's dtype over the batch and every KV head (what
        the uncompressed cache holds per token)."""
        return self.token

    # ------------------------------------------------------------------ the seam's append
    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Append ``k`` slots: ``keys``/``values`` ``[batch, kv_heads, k, head_dim]``, ``positions``
        ``[k]`` int64 (the same tokens for every head); other fields take their fill value. The
        first call allocates the buffers with the incoming dtype and device; after :meth:`count_ahead`,
        the slots are written at the device count ``count`` (no host integer)."""
        k = keys.shape[2]
        if self._ahead:
            self._ahead, at = 0, self.count + torch.arange(k, device=self.count.device)
            fields = self._encode(keys, values) | {"positions": positions.expand(*keys.shape[:2], k)}
            for name, t in fields.items():
                self.buffers[name].index_copy_(2, at, t)
            for name, fill in self.fills.items():
                self.buffers[name].index_fill_(2, at, fill)
            self.count += k
            return
        if not self.buffers:
            self._allocate(keys, values, self.capacity_for(k))
        else:
            self.make_room(k)
        n, buffers = self.n, self.buffers
        self._append_kv(keys, values)
        buffers["positions"].narrow(2, n, k).copy_(positions)
        for name, fill in self.fills.items():
            buffers[name].narrow(2, n, k).fill_(fill)
        self.n = n + k

    def _encode(self, keys: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
        """The codec's fields of ``keys`` and ``values`` ``[batch, kv_heads, k, head_dim]``."""
        codec, dtype = self.codec, self.dtype
        return codec.encode("keys", keys.to(dtype)) | codec.encode("values", values.to(dtype))

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, cap: int) -> None:
        """The buffers for ``cap`` slots, shaped as the codec's fields of the first token."""
        b, h = keys.shape[:2]
        self.dtype, self.token = keys.dtype, b * h * (keys.shape[-1] + values.shape[-1]) * keys.element_size()
        first = self._encode(keys[:, :, :1], values[:, :, :1])
        self.buffers = {f: t.new_empty((b, h, cap, *t.shape[3:])) for f, t in first.items()}
        self.kv_fields = tuple(first)
        self.buffers["positions"] = torch.empty((b, h, cap), dtype=torch.long, device=keys.device)
        for name in self.fills:
            self.buffers[name] = torch.empty((b, h, cap), dtype=torch.float32, device=keys.device)

    def _append_kv(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``k`` appended tokens' keys and values at slots ``n .. n + k - 1``."""
        for field, t in self._encode(keys, values).items():
            self.buffers[field].narrow(2, self.n, t.shape[2]).copy_(t)

    def make_room(self, k: int) -> None:
        """Reallocate now (to the owner's capacity) if ``k`` more slots do not fit
        (``SlotStorage.make_room``)."""
        if self.buffers and self.n + k > self.capacity:
            self._reallocate(self.capacity_for(self.n + k))

    def count_ahead(self, k: int, grows: bool) -> None:
        """Before a compiled step of ``k`` tokens (``SlotStorage.count_ahead``): on a growing layer, with
        room made, ``n`` counts the step's slots now, and the step writes them at the device count
        ``count`` and attends over the whole capacity with a validity mask (:meth:`attend`), as
        transformers' StaticCache does: its graph has the same shapes and no host integer at every step
        (Dynamo would recompile as ``n`` changes, CUDA graph trees record one graph per value). The
        count is set from ``n``, and the slots past it zeroed (masked slots must hold finite numbers;
        buffers grown later are zeroed, :meth:`_reallocate`), whenever ``n`` changed outside these
        steps. A bounded layer is static once full: nothing."""
        if not grows:
            return
        if self.n != self._synced:
            for buf in self.buffers.values():
                buf.narrow(2, self.n, buf.shape[2] - self.n).zero_()
            if self.count is None:
                self.count = torch.zeros((), dtype=torch.long, device=self.buffers["positions"].device)
            self.count.fill_(self.n)
        self.n += k
        self._ahead, self._synced = k, self.n

    def _reallocate(self, cap: int) -> None:
        """Move the valid slots into buffers of ``cap`` slots, zeros past them (the old ones are
        released)."""
        new = {}
        for name, buf in self.buffers.items():
            new[name] = buf.new_zeros((*buf.shape[:2], cap, *buf.shape[3:]))
            new[name][:, :, : self.n] = buf[:, :, : self.n]
        self.buffers = new

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
