"""Attention scores that methods rank tokens by, computed without a T x T matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.prefill import group_queries, grouped_logits, logits_buffer, softcap_logits
from methods.score_memo import lookup, remember

__all__ = [
    "causal_column_sums",
    "complement",
    "group_queries",
    "keep_index",
    "lowest_score",
    "mask_future_block_",
    "pool_scores",
    "softcap_logits",
    "window_attention",
    "window_logits",
]


def mask_future_block_(logits: torch.Tensor, start: int) -> torch.Tensor:
    """Causal mask, in place, of the logits ``[..., m, keys]`` of the ``m`` queries at positions
    ``start .. start + m - 1`` over keys at positions ``0 ..``: only their own block (key columns
    ``start .. start + m - 1``) holds keys after a query, so only its upper triangle is set to
    ``-inf`` (keys past ``start + m`` must not be in ``logits``). Returns ``logits``."""
    m = logits.shape[-2]
    future = torch.ones(m, m, dtype=torch.bool, device=logits.device).triu_(1)
    logits[..., start : start + m].masked_fill_(future, float("-inf"))
    return logits


def window_logits(
    query: torch.Tensor, keys: torch.Tensor, window: int, scaling: float, softcap: float | None = None
) -> torch.Tensor:
    """Causal logits of the last ``window`` prompt queries over all prompt keys, per query head.

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, prompt, head_dim]`` post-RoPE queries.
    keys : torch.Tensor
        ``[batch, kv_heads, prompt, head_dim]`` post-RoPE keys.
    window : int
        Observation window (queries); clipped to the prompt length.
    scaling : float
        Softmax scale.
    softcap : float | None
        Logit soft-cap (Gemma-2; :func:`softcap_logits`), or None.

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, group, window, prompt]`` float32 ``q k^T * scaling`` (soft-capped),
        ``-inf`` where a key comes after the query; row ``i`` is query ``prompt - window + i``.
    """
    length = keys.shape[-2]
    w = min(window, length)
    q = group_queries(query[:, :, length - w :], keys.shape[1]).float()
    return mask_future_block_(grouped_logits(q, keys.float(), scaling, softcap), length - w)


def window_attention(
    query: torch.Tensor, keys: torch.Tensor, window: int, scaling: float, softcap: float | None = None
) -> torch.Tensor:
    """Attention probabilities of the last ``window`` prompt queries over all prompt keys.

    The observation window of SnapKV (Li et al. 2024, Sec. 4) and ZSMerge (App. B, window_size);
    causal inside the window, softmax in float32, averaged over the query heads of each KV group.
    Arguments as :func:`window_logits`.

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, window, prompt]`` float32; row ``i`` is query ``prompt - window + i``.
    """
    return torch.softmax(window_logits(query, keys, window, scaling, softcap), dim=-1).mean(dim=2)


def pool_scores(scores: torch.Tensor, kernel_size: int, pooling: str = "max") -> torch.Tensor:
    """1-D pooling of scores along the slot axis (stride 1, same length), as SnapKV Sec. 4.

    Parameters
    ----------
    scores : torch.Tensor
        ``[batch, kv_heads, slots]``.
    kernel_size : int
        Odd kernel width; 1 or less returns ``scores`` unchanged.
    pooling : str
        ``"max"`` or ``"avg"``.

    Raises
    ------
    ValueError
        For an even kernel or an unknown pooling.
    """
    if kernel_size <= 1:
        return scores
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd, got {kernel_size}")
    b, h, n = scores.shape
    flat = scores.reshape(b * h, 1, n)
    pad = kernel_size // 2
    if pooling == "max":
        out = F.max_pool1d(flat, kernel_size, stride=1, padding=pad)
    elif pooling == "avg":
        out = F.avg_pool1d(flat, kernel_size, stride=1, padding=pad)  # zero padding counted, as kvpress
    else:
        raise ValueError(f"pooling must be 'max' or 'avg', got {pooling!r}")
    return out.view(b, h, n)


def causal_column_sums(
    query: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    chunk: int = 256,
    row_weights: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Column sums of the causal prompt attention matrix, computed in query chunks.

    H2O's accumulated attention at prefill (Zhang et al. 2023, Sec. 3; docs/methods.md, "Conventions"):
    ``acc(j) = sum_i softmax_i(q_i k^T)[j]`` over all prompt queries ``i >= j``. Memory is
    ``O(chunk x prompt x q_heads)``; the full prompt x prompt matrix never exists.

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, prompt, head_dim]`` post-RoPE.
    keys : torch.Tensor
        ``[batch, kv_heads, prompt, head_dim]`` post-RoPE.
    scaling : float
        Softmax scale.
    chunk : int
        Query rows per chunk.
    row_weights : torch.Tensor | None
        ``[prompt]`` weight of each query row (None: all 1). ZeroMerge's prefill initialisation
        weights row ``i`` by ``lam ** (prompt - 1 - i)``.
    softcap : float | None
        Logit soft-cap (Gemma-2; :func:`softcap_logits`), or None.

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, prompt]`` float32, averaged over the query heads of each group. Within
        ``methods.score_memo.shared_scores`` (a grid's prefill) an equal earlier call's result.
    """
    args = (scaling, chunk, softcap)
    if (shared := lookup(query, keys, row_weights, args)) is not None:  # a grid's earlier setting
        return shared
    b, hkv, length, _ = keys.shape
    q, k = group_queries(query, hkv), keys.float()
    out = torch.zeros((b, hkv, length), dtype=torch.float32, device=keys.device)
    buffer = logits_buffer(query, min(chunk, length), length)  # every chunk's logits
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        logits = grouped_logits(q[:, :, :, start:stop].float(), k[:, :, :stop], scaling, softcap, out=buffer)
        probs = torch.softmax(mask_future_block_(logits, start), dim=-1, out=logits)
        if row_weights is None:
            out[..., :stop] += probs.sum(dim=3).mean(dim=2)
        else:
            w = row_weights[start:stop].to(probs.dtype)
            out[..., :stop] += torch.einsum("bhgqk,q->bhk", probs, w) / probs.shape[2]
    remember(query, keys, row_weights, args, out)
    return out


def keep_index(scores: torch.Tensor, first: int, n_top: int, recent: int) -> torch.Tensor:
    """Slots to keep of a prompt held in position order: the ``first`` slots, the ``n_top`` highest
    scores among the slots between them and the recent window, then the last ``recent`` slots.

    The selection of every score-then-evict method at prefill (H2O's heavy hitters + recent window,
    SnapKV's top votes + observation window, StreamingLLM's attention sinks + recent window,
    ZSMerge's context set + proximity window, KeepKV's sinks + top + recent).

    Parameters
    ----------
    scores : torch.Tensor
        ``[batch, kv_heads, slots]``; only slots ``first .. slots - recent - 1`` are ranked.
    first, n_top, recent : int
        Protected first tokens, top-scored tokens and protected recent window (tokens).

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, first + n_top + recent]`` int64, ascending slot (= position) order.
    """
    b, h, n = scores.shape
    dev = scores.device
    top = scores[..., first : n - recent].topk(n_top, dim=-1).indices.sort(dim=-1).values + first
    head = torch.arange(first, device=dev).expand(b, h, first)
    tail = torch.arange(n - recent, n, device=dev).expand(b, h, recent)
    return torch.cat([head, top, tail], dim=-1)


def lowest_score(scores: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Per head, the candidate slot with the lowest score: ``[batch, kv_heads]`` int64.

    ``candidates`` is a ``[batch, kv_heads, slots]`` bool mask with at least one True per head.
    """
    return torch.where(candidates, scores, torch.inf).argmin(dim=-1)


def complement(index: torch.Tensor, n: int) -> torch.Tensor:
    """The slots of ``[0, n)`` not in ``index`` ``[batch, kv_heads, k]`` (distinct per head), in
    position order: ``[batch, kv_heads, n - k]`` int64 (what a keep-set evicts)."""
    b, h, k = index.shape
    kept = torch.zeros((b, h, n), dtype=torch.bool, device=index.device).scatter(2, index, True)
    return (~kept).nonzero(as_tuple=True)[2].view(b, h, n - k)
