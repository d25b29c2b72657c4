"""Indexing of slot tensors ``[batch, kv_heads, slots, *extra]`` by per-head slot indices ``[batch,
kv_heads, k]``: what every store operation and method uses to read or write chosen slots."""

from __future__ import annotations

import torch


def slot_index(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``index`` ``[batch, kv_heads, k]`` expanded over the trailing dims of a slot tensor ``t``."""
    if t.dim() == 3:
        return index
    extra = t.shape[3:]
    return index.view(*index.shape, *([1] * len(extra))).expand(*index.shape, *extra)


def memo_slot_index(memo: dict, t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """:func:`slot_index` of ``index`` over ``t``, built once per trailing shape of ``t`` in ``memo``
    (one expanded index for a store's buffers of one shape)."""
    key = t.shape[3:]
    if key not in memo:
        memo[key] = slot_index(t, index)
    return memo[key]


def gather_slots(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[b, h, index[b, h, j], ...]`` for a slot tensor ``[batch, kv_heads, slots, *extra]``."""
    return t.gather(2, slot_index(t, index))
