"""KIVI's arithmetic that its uniform store (``methods.quant.kivi``) and its ragged heads
(``methods.quant.kivi_ragged``) share: key statistics per channel, value codes per token, held bytes."""

from __future__ import annotations

import torch

from methods.quant import codes as q


def key_stats(
    x: torch.Tensor, present: torch.Tensor, group: int, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """KIVI's per-channel key scale and zero point ``[b, h, k / G, d]`` of ``x`` ``[b, h, k, d]`` in
    groups of G = ``group`` tokens over the ``present`` ``[b, h, k]`` ones (Sec. 3.1: ``z = min``,
    ``s = (max - min) / (2^bits - 1)`` per channel; a group with none: 0 and 0)."""
    b, h, k, d = x.shape
    mask = present.view(b, h, k // group, group, 1)
    grouped = x.view(b, h, k // group, group, d)
    lo = torch.where(mask, grouped, torch.inf).amin(3)
    hi = torch.where(mask, grouped, -torch.inf).amax(3)
    empty = ~mask.any(3)
    lo, hi = lo.masked_fill(empty, 0), hi.masked_fill(empty, 0)
    return (hi - lo) / (2**bits - 1), lo


def value_codes(x: torch.Tensor, group: int, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KIVI's value codes: ``x`` ``[..., d]`` per token in groups of G = ``group`` channels (``head_dim``
    when it is smaller), as ``codes.per_token``."""
    return q.per_token(x, q.group_size(x.shape[-1], group), bits)


def held_bytes(
    key_ref: torch.Tensor, value_ref: torch.Tensor, code: int, value_extra: int, row: int, groups: int
) -> int:
    """Bytes KIVI holds for the held slots whose references are ``key_ref`` and ``value_ref`` (any
    shape, the same count): 4 per reference; ``code`` per quantized key (reference >= 0); ``code +
    value_extra`` (its scale and zero point) per quantized value; a full-precision ``row`` per residual
    key or value; two rows (scale, zero point) per referenced key group (``groups`` of them)."""
    kq, vq = int((key_ref >= 0).sum()), int((value_ref >= 0).sum())
    refs = key_ref.numel() + value_ref.numel()
    return refs * 4 + kq * code + vq * (code + value_extra) + (refs - kq - vq) * row + groups * 2 * row
