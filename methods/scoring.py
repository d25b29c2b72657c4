"""Attention scores that methods rank tokens by, computed without a T x T matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def group_queries(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """View ``[batch, q_heads, q, head_dim]`` as ``[batch, kv_heads, group, q, head_dim]`` (no copy)."""
    b, hq, q, d = query.shape
    return query.view(b, kv_heads, hq // kv_heads, q, d)


def window_attention(query: torch.Tensor, keys: torch.Tensor, window: int, scaling: float) -> torch.Tensor:
    """Attention probabilities of the last ``window`` prompt queries over all prompt keys.

    The observation window of SnapKV (Li et al. 2024, Sec. 4) and ZSMerge (App. B, window_size);
    causal inside the window, softmax in float32, averaged over the query heads of each KV group.

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

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, window, prompt]`` float32; row ``i`` is query ``prompt - window + i``.
    """
    length = keys.shape[-2]
    w = min(window, length)
    q = group_queries(query[:, :, length - w :], keys.shape[1]).float()
    logits = torch.einsum("bhgqd,bhkd->bhgqk", q, keys.float()) * scaling
    q_pos = torch.arange(length - w, length, device=keys.device)
    k_pos = torch.arange(length, device=keys.device)
    logits = logits.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return torch.softmax(logits, dim=-1).mean(dim=2)


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
        out = F.avg_pool1d(flat, kernel_size, stride=1, padding=pad, count_include_pad=False)
    else:
        raise ValueError(f"pooling must be 'max' or 'avg', got {pooling!r}")
    return out.view(b, h, n)
