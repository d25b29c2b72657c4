"""Decode attention over a compressed cache: one query per head, per-slot log-weight bias.

This PyTorch function is the specification of the decode step (issue 9 adds a Triton kernel that
must match it). GQA is handled by grouping query heads onto their KV head, never by repeating KV.
"""

from __future__ import annotations

import torch


def decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    return_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of new queries over the cache with an additive per-slot bias (ZSMerge Eq. 8).

    ``a = softmax(q k^T * scaling + log_weight)`` in float32, ``o = a V``.

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, q_len, head_dim]`` (``q_len`` is 1 at a decode step).
    keys, values : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``.
    log_weight : torch.Tensor | None
        ``[batch, kv_heads, slots]`` float32 bias, or None for none.
    scaling : float
        Softmax scale.
    return_logits : bool
        Return the unbiased logits instead of the group-mean probabilities.

    Returns
    -------
    out : torch.Tensor
        ``[batch, q_heads, q_len, head_dim]`` in the query's dtype.
    probs : torch.Tensor
        ``[batch, kv_heads, slots]`` float32: the probabilities averaged over the query heads of
        each group and over ``q_len``; with ``return_logits`` the float32 logits
        ``q k^T * scaling`` (no bias) ``[batch, kv_heads, group * q_len, slots]``.
    """
    b, hq, q_len, d = query.shape
    hkv = keys.shape[1]
    q = query.reshape(b, hkv, (hq // hkv) * q_len, d) * scaling
    logits = torch.matmul(q, keys.transpose(-1, -2)).float()
    biased = logits + log_weight.unsqueeze(2) if log_weight is not None else logits
    probs = torch.softmax(biased, dim=-1)
    out = torch.matmul(probs.to(values.dtype), values).view(b, hq, q_len, values.shape[-1])
    return out, (logits if return_logits else probs.mean(dim=2))
