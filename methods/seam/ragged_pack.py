"""Packing the kept slots of a uniform layer into ragged heads (``methods.seam.ragged``): each (batch,
KV head) segment gets a contiguous range of one buffer per field, as long as the slots it keeps plus
the tokens it may still receive."""

from __future__ import annotations

import torch


def pack_kept(
    fields: dict[str, torch.Tensor], keep: torch.Tensor, room: int, bounds: torch.Tensor | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack the slots ``keep`` selects, per head, in slot order (every field given, as it is).

    Parameters
    ----------
    fields : dict[str, torch.Tensor]
        ``keys``/``values`` ``[batch, kv_heads, n, head_dim]`` and ``positions``
        ``[batch, kv_heads, n]`` of the uniform layer (a quantized kind: its code fields
        ``[batch, kv_heads, n, *extra]`` instead of keys and values).
    keep : torch.Tensor
        ``[batch, kv_heads, n]`` bool: the slots each head keeps (at least one per head).
    room : int
        Tokens a growing segment may still receive (the run's remaining tokens, when known).
    bounds : torch.Tensor | None
        ``[batch, kv_heads]`` int64: a segment's bound (it evicts back to it after each append
        and holds ``max(kept, bound) + 1`` slots), or -1 for a segment that keeps what it
        receives (default: every segment grows).

    Returns
    -------
    tuple
        ``buffers`` (field -> ``[total, *extra]``; never-written slots: ``positions`` -1, others 0),
        ``offsets``, ``capacity``, ``lengths`` (slots kept) and ``bounds``, each ``[segments]``
        int64 (segment ``s = b * kv_heads + h``).

    Raises
    ------
    ValueError
        If a head keeps nothing.
    """
    b, h, n = keep.shape
    counts = keep.sum(-1).reshape(-1)
    if bool((counts == 0).any()):
        raise ValueError("every KV head must keep at least one slot")
    bounds = torch.full_like(counts, -1) if bounds is None else bounds.reshape(-1).to(counts.device)
    grows = bounds < 0
    capacity = torch.where(grows, counts + room, torch.maximum(bounds, counts) + 1)
    offsets = torch.cumsum(capacity, 0) - capacity
    total = int(capacity.sum())  # the one host synchronisation, at prefill
    flat = keep.reshape(b * h, n)
    rank = torch.cumsum(flat, -1) - 1  # index of each kept slot inside its segment
    dest = (offsets.unsqueeze(-1) + rank)[flat]  # packed index of every kept slot, segment order
    buffers = {}
    for name, x in fields.items():
        buffers[name] = placed(name, x.reshape(b * h, n, *x.shape[3:])[flat], dest, total)
    return buffers, offsets, capacity, counts.clone(), bounds


def regrow(
    buffers: dict[str, torch.Tensor],
    capacity: torch.Tensor,
    grows: torch.Tensor,
    segment: torch.Tensor,
    local: torch.Tensor,
    valid: torch.Tensor,
    more: int,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """New buffers in which every growing segment (``grows`` ``[segments]`` bool) has ``more`` slots
    more of ``capacity`` ``[segments]``, the ``valid`` ``[total]`` slots copied to the same place in
    their segment (``segment``, ``local``: ``[total]``, as ``RaggedStore``). Returns the buffers,
    the new ``offsets`` and ``capacity``."""
    capacity = capacity + torch.where(grows, more, 0)
    offsets = torch.cumsum(capacity, 0) - capacity
    total = int(capacity.sum())
    dest = (offsets.index_select(0, segment) + local)[valid]
    return {name: placed(name, buf[valid], dest, total) for name, buf in buffers.items()}, offsets, capacity


def placed(name: str, rows: torch.Tensor, dest: torch.Tensor, total: int) -> torch.Tensor:
    """A ``[total, *extra]`` buffer of field ``name`` holding ``rows`` ``[k, *extra]`` at ``dest``
    ``[k]``; the other slots -1 (``positions``) or 0."""
    buf = rows.new_full((total, *rows.shape[1:]), -1 if name == "positions" else 0)
    buf[dest] = rows
    return buf
