"""Prompt attention (:func:`prefill_attention`: causal, with an optional sliding window and logit
soft-cap) and the two helpers every attention over cached keys uses: soft-capping and the grouping of
query heads onto their KV head. The PyTorch path; the seam's prefill (``methods.seam.step``), probe
forwards (``runners.generation.probe``) and methods' scoring (``methods.scoring``) call it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def softcap_logits(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Attention-logit soft-capping (Gemma-2, ``attn_logit_softcapping``): ``c * tanh(logits / c)``;
    ``logits`` unchanged when ``softcap`` is None."""
    return logits if softcap is None else torch.tanh(logits / softcap) * softcap


def group_queries(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """View ``[batch, q_heads, q, head_dim]`` as ``[batch, kv_heads, group, q, head_dim]`` (no copy)."""
    b, hq, q, d = query.shape
    return query.view(b, kv_heads, hq // kv_heads, q, d)


def grouped_logits(
    query: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled, soft-capped (:func:`softcap_logits`) logits ``q k^T * scaling`` of grouped queries.

    One batched product per KV head with its group's queries as rows (a product broadcast over the
    group copies the keys once per query head), scaled and soft-capped in place (out of place where
    autograd records it). On a CPU a fresh block of logits costs about its product again in page
    faults: a loop over query blocks passes one ``out`` buffer for all of them.

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, kv_heads, group, q, head_dim]`` float32 (:func:`group_queries`).
    keys : torch.Tensor
        ``[batch, kv_heads, keys, head_dim]`` float32 (a slice along ``keys`` is read without a copy).
    scaling : float
        Softmax scale.
    softcap : float | None
        Logit soft-cap ``c``, or None.
    out : torch.Tensor | None
        A float32 buffer of at least ``batch x q_heads x q x keys`` elements (any shape) to write
        into, or None for a new tensor.

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, group, q, keys]`` float32, equal to ``einsum("bhgqd,bhkd->bhgqk")`` times
        ``scaling``, soft-capped.
    """
    b, h, g, q, d = query.shape
    shape = torch.Size((b, h, g, q, keys.shape[2]))
    rows, cols = query.reshape(b * h, g * q, d), keys.flatten(0, 1).mT
    flat = None if out is None else out.view(-1)[: shape.numel()].view(b * h, g * q, -1)
    logits = torch.bmm(rows, cols, out=flat).view(shape).mul_(scaling)
    if softcap is None:
        return logits
    if logits.requires_grad:  # a backward needs tanh's output (KVgrad's probe forwards)
        return softcap_logits(logits, softcap)
    return logits.div_(softcap).tanh_().mul_(softcap)


def logits_buffer(query: torch.Tensor, rows: int, keys: int) -> torch.Tensor:
    """A flat float32 buffer for :func:`grouped_logits`' ``out``: ``rows`` queries of every query head
    of ``query`` ``[batch, q_heads, ...]`` over at most ``keys`` keys, on the query's device."""
    return torch.empty(
        query.shape[0] * query.shape[1] * rows * keys, dtype=torch.float32, device=query.device
    )


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    window: int | None = None,
    softcap: float | None = None,
    chunk: int = 512,
) -> torch.Tensor:
    """Causal attention of a prompt over itself, with an optional sliding window and logit soft-cap.

    Query ``i`` attends to keys ``j`` with ``i - window < j <= i`` (transformers'
    ``sliding_window_overlay``); soft-capping maps logits to ``c * tanh(logits / c)`` before the
    softmax (Gemma-2, ``attn_logit_softcapping``). Without either this is fused causal SDPA;
    with them, queries go in chunks whose keys start at the window's start, so memory is
    ``O(chunk x (chunk + window))`` per head, never ``prompt x prompt``.

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, prompt, head_dim]`` post-RoPE.
    key, value : torch.Tensor
        ``[batch, kv_heads, prompt, head_dim]``.
    scaling : float
        Softmax scale.
    window : int | None
        Sliding window (tokens), or None for full causal attention.
    softcap : float | None
        Logit soft-cap ``c``, or None.
    chunk : int
        Query rows per chunk.

    Returns
    -------
    torch.Tensor
        ``[batch, q_heads, prompt, head_dim]`` in the query's dtype.
    """
    length = query.shape[2]
    if softcap is None and (window is None or window >= length):
        return F.scaled_dot_product_attention(
            query, key, value, is_causal=length > 1, scale=scaling, enable_gqa=True
        )
    b, hq = query.shape[:2]
    hkv = key.shape[1]
    out = torch.empty((b, hq, length, value.shape[-1]), dtype=query.dtype, device=query.device)
    widest = min(length, chunk + (length if window is None else window - 1))  # a chunk's keys at most
    buffer = logits_buffer(query, min(chunk, length), widest)
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        lo = 0 if window is None else max(0, start - window + 1)
        q_pos = torch.arange(start, stop, device=query.device)[:, None]
        k_pos = torch.arange(lo, stop, device=query.device)[None, :]
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= k_pos > q_pos - window
        q = group_queries(query[:, :, start:stop], hkv).float()
        logits = grouped_logits(q, key[:, :, lo:stop].float(), scaling, softcap, out=buffer)
        probs = torch.softmax(logits.masked_fill_(~allowed, float("-inf")), dim=-1, out=logits)
        rows = torch.einsum("bhgqk,bhkd->bhgqd", probs, value[:, :, lo:stop].float())
        out[:, :, start:stop] = rows.reshape(b, hq, stop - start, -1).to(query.dtype)
    return out
