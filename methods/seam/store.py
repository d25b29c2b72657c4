"""The slot store of one decoder layer: fixed-capacity buffers for every per-slot tensor and a
handful of operations, the only code that writes them (docs/design.md, "The slot store").

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
tokens by ``positions``. One write bypasses these operations by design: a method with a fused score
update (``Traits.score_decay``) has the decode attention update its ``scores`` view in place
(the Triton kernel's ``s <- lambda s + a``), on the valid slots only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kernels import decode_attention
from methods.seam.ragged import RaggedStore
from methods.seam.slots import gather_slots, slot_index
from methods.seam.storage import SlotStorage

if TYPE_CHECKING:
    from methods.seam.contract import Traits

#: Fields every store has, besides the method's state: name -> fill of slots appended by the seam.
BASE_FILLS = {"log_weight": 0.0}
#: Fields whose dtype the store fixes (values given to :meth:`SlotStore.reset` are cast).
FIXED_DTYPES = ("keys", "values", "log_weight", "positions")


class SlotStore(SlotStorage):
    """Fixed-capacity slot buffers of one layer (module docstring).

    Parameters
    ----------
    fills : dict[str, float]
        The method's state fields and the value a slot appended by the seam starts with
        (``Traits.state_fill``); ``log_weight`` (0) is always present.
    capacity : Callable[[int], int]
        Slots to allocate for a buffer that must hold ``needed`` slots (the owner's rule).

    Attributes
    ----------
    n : int
        Valid slots per (batch, KV head).
    buffers : dict[str, torch.Tensor]
        ``[batch, kv_heads, capacity, *extra]`` per field: ``keys``/``values`` in the model's dtype,
        ``log_weight`` and method state float32, ``positions`` int64.
    """

    kind = "uniform"

    def __init__(self, fills: dict[str, float], capacity: Callable[[int], int]) -> None:
        self.fills = BASE_FILLS | dict(fills)
        self.capacity_for = capacity
        self.buffers: dict[str, torch.Tensor] = {}
        self.n = 0

    # ------------------------------------------------------------------ reading
    @property
    def n_slots(self) -> int:
        """Valid slots per (batch, KV head)."""
        return self.n

    def view(self, name: str) -> torch.Tensor:
        """The valid slots of field ``name``: ``[batch, kv_heads, n, *extra]`` (a view).

        Raises
        ------
        KeyError
            For a field the store does not hold, or before the first append.
        """
        if name not in self.buffers:
            raise KeyError(f"the layer holds no {name!r} (fields: {sorted(self.buffers) or 'none yet'})")
        return self.buffers[name].narrow(2, 0, self.n)

    def state_names(self) -> tuple[str, ...]:
        """The method's state fields (``Traits.state_fill``)."""
        return tuple(name for name in self.fills if name != "log_weight")

    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]`` int64, every head ``n``."""
        b, h = self.buffers["keys"].shape[:2] if self.buffers else (1, 1)
        return torch.full((b, h), self.n, dtype=torch.long)

    @property
    def capacity(self) -> int:
        """Slots the buffers hold (valid or not)."""
        return self.buffers["keys"].shape[2] if self.buffers else 0

    def allocated_bytes(self) -> int:
        """Bytes of every buffer, capacity included."""
        return sum(buf.untyped_storage().nbytes() for buf in self.buffers.values())

    def kv_bytes(self) -> int:
        """Bytes of the held keys and values (slots x kv_heads x head_dim x dtype size x batch)."""
        if not self.buffers:
            return 0
        return sum(self.view(name).numel() * self.buffers[name].element_size() for name in ("keys", "values"))

    def state_bytes(self) -> int:
        """Bytes of the held slots' bias, positions and method state."""
        names = [name for name in self.buffers if name not in ("keys", "values")]  # none before an append
        return sum(self.view(name).numel() * self.buffers[name].element_size() for name in names)

    def token_bytes(self) -> int:
        """Key + value bytes of one token over the batch and every KV head."""
        if not self.buffers:
            return 0
        k, v = self.buffers["keys"], self.buffers["values"]
        return k.shape[0] * k.shape[1] * (k.shape[-1] + v.shape[-1]) * k.element_size()

    # ------------------------------------------------------------------ the seam's append
    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Append ``k`` slots: ``keys``/``values`` ``[batch, kv_heads, k, head_dim]``, ``positions``
        ``[k]`` int64 (the same tokens for every head); other fields take their fill value. The
        first call allocates the buffers with the incoming dtype and device."""
        b, h, k = keys.shape[:3]
        if not self.buffers:
            cap = self.capacity_for(k)
            self.buffers = {
                "keys": keys.new_empty((b, h, cap, keys.shape[-1])),
                "values": values.new_empty((b, h, cap, values.shape[-1])),
                "positions": torch.empty((b, h, cap), dtype=torch.long, device=keys.device),
            }
            for name in self.fills:
                self.buffers[name] = torch.empty((b, h, cap), dtype=torch.float32, device=keys.device)
        else:
            self.make_room(k)
        n, buffers = self.n, self.buffers
        buffers["keys"].narrow(2, n, k).copy_(keys)
        buffers["values"].narrow(2, n, k).copy_(values)
        buffers["positions"].narrow(2, n, k).copy_(positions)
        for name, fill in self.fills.items():
            buffers[name].narrow(2, n, k).fill_(fill)
        self.n = n + k

    def make_room(self, k: int) -> None:
        """Reallocate now (to the owner's capacity) if ``k`` more slots do not fit
        (``SlotStorage.make_room``)."""
        if self.buffers and self.n + k > self.capacity:
            self._reallocate(self.capacity_for(self.n + k))

    def _reallocate(self, cap: int) -> None:
        """Move the valid slots into buffers of ``cap`` slots (the old ones are released)."""
        new = {}
        for name, buf in self.buffers.items():
            new[name] = buf.new_empty((*buf.shape[:2], cap, *buf.shape[3:]))
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
        last = self.n - 1
        index = slot.unsqueeze(-1)
        for buf in self.buffers.values():
            buf.scatter_(2, slot_index(buf, index), buf.narrow(2, last, 1).clone())  # the victim may be last
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
        ``[batch, kv_heads, k, *extra]`` (cast to the field's dtype) or a scalar."""
        for name, value in fields.items():
            buf = self.buffers[name]
            if isinstance(value, torch.Tensor):
                buf.scatter_(2, slot_index(buf, slot), value.to(buf.dtype))
            else:
                buf.scatter_(2, slot_index(buf, slot), torch.full_like(gather_slots(buf, slot), value))

    def merge_into(
        self,
        target: torch.Tensor,
        source: torch.Tensor,
        weight_target: torch.Tensor,
        weight_source: torch.Tensor,
        fields: tuple[str, ...] = ("keys", "values"),
    ) -> None:
        """Replace slot ``target`` by the weighted mean of ``target`` and ``source`` for each field:
        ``(w_t x_t + w_s x_s) / (w_t + w_s)``, in float32 or better (ZSMerge Eq. 7's incremental
        mean with fusion counts as weights). ``target``, ``source``, ``weight_*`` are
        ``[batch, kv_heads, 1]``; the source slot is left as it is (evict it after)."""
        total = weight_target + weight_source
        for name in fields:
            buf = self.buffers[name]
            acc = torch.promote_types(buf.dtype, torch.float32)
            x_t, x_s = gather_slots(buf, target).to(acc), gather_slots(buf, source).to(acc)
            w_t = (weight_target.to(acc) / total.to(acc)).view(*target.shape, *([1] * (buf.dim() - 3)))
            w_s = (weight_source.to(acc) / total.to(acc)).view(*target.shape, *([1] * (buf.dim() - 3)))
            buf.scatter_(2, slot_index(buf, target), (w_t * x_t + w_s * x_s).to(buf.dtype))

    def write(self, name: str, value: torch.Tensor) -> None:
        """Set field ``name`` over all valid slots to ``value`` ``[batch, kv_heads, n, *extra]``; a
        field whose trailing shape changes (a method's state sized at prefill) gets a new buffer."""
        buf = self.buffers[name]
        if buf.shape[3:] != value.shape[3:] or buf.dtype != value.dtype:
            buf = self.buffers[name] = value.new_empty((*buf.shape[:3], *value.shape[3:]))
        buf[:, :, : self.n] = value

    def reset(self, **fields: torch.Tensor) -> None:
        """Replace every slot at once by compact tensors ``[batch, kv_heads, k, *extra]`` (merge
        rebuilds: ZSMerge's residual slots, KVMerger's sets, KeepKV's groups); fields not given
        take their fill value (positions: -1). New buffers sized for ``k`` slots plus an append."""
        k = fields["keys"].shape[2]
        cap = max(self.capacity_for(k + 1), k)
        new = {}
        for name, buf in self.buffers.items():
            value = fields.get(name)
            extra = buf.shape[3:] if value is None else value.shape[3:]
            dtype = buf.dtype if value is None or name in FIXED_DTYPES else value.dtype
            new[name] = torch.empty((*buf.shape[:2], cap, *extra), dtype=dtype, device=buf.device)
            new[name][:, :, :k] = value if value is not None else self.fills.get(name, -1)
        self.buffers, self.n = new, k

    # ------------------------------------------------------------------ kinds and attention
    def ragged(self, keep: torch.Tensor, bounds: torch.Tensor | None = None) -> RaggedStore:
        """The slots ``keep`` ``[batch, kv_heads, slots]`` (bool) selects, packed per head in a
        :class:`~methods.seam.ragged.RaggedStore` (``bounds`` as there); room for what the owner's
        capacity rule says an unbounded layer will still receive. Method state is not carried over."""
        room = self.capacity_for(self.n + 1) - self.n
        fields = {name: self.view(name) for name in ("keys", "values", "positions")}
        return RaggedStore.from_mask(fields, keep, room, bounds)

    def attend(
        self, query: torch.Tensor, scaling: float, traits: Traits, softcap: float | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode attention over the slots (``SlotStorage.attend``): fused SDPA when the method needs
        nothing back, no bias and no soft-cap; otherwise ``kernels.decode_attention`` with the bias,
        returning the group-mean probabilities or the logits, with the ``score_decay`` update fused
        into the ``scores`` field (the one write outside the store's operations)."""
        needs, keys, values = traits.needs, self.view("keys"), self.view("values")
        if needs == "none" and not traits.uses_log_weight and softcap is None:
            return F.scaled_dot_product_attention(query, keys, values, scale=scaling, enable_gqa=True), None
        decay = traits.score_decay if needs == "probs" else None
        fused = None if decay is None else self.view("scores")  # updated in place
        out, scores = decode_attention(
            query,
            keys,
            values,
            self.view("log_weight") if traits.uses_log_weight else None,
            scaling,
            return_logits=needs == "logits",
            scores=fused,
            decay=1.0 if decay is None else decay,
            softcap=softcap,
        )
        return out, None if needs == "none" or fused is not None else scores
