"""LESS training objective (Dong et al., ICML 2024, Sec. 4.2; docs/methods.md, "LESS"; from
hdong920/LESS src/train_kernels.py): the sparse policy's attention plus the low-rank term,
evaluated in parallel over a whole training window so one layer's kernels can be fitted to
that layer's full-attention output.
"""

from __future__ import annotations

import torch

from methods.less.kernels import LessKernels
from methods.scoring import group_queries, lowest_score, window_logits


def h2o_keep_mask(
    query: torch.Tensor, keys: torch.Tensor, scaling: float, heavy: int, recent: int
) -> torch.Tensor:
    """Which keys H2O holds when each query attends, simulated token by token (the decode rule).

    Query ``t`` sees keys ``<= t``; once more than ``heavy + recent`` are held, the held key with
    the lowest accumulated attention outside the ``recent`` newest is evicted for good. Scores
    accumulate the softmax over the held keys (group mean, as ``methods.h2o``).

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, length, head_dim]`` post-RoPE.
    keys : torch.Tensor
        ``[batch, kv_heads, length, head_dim]`` post-RoPE.
    scaling : float
        Softmax scale.
    heavy, recent : int
        H2O's heavy-hitter and recent-window slots (tokens).

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, length, length]`` bool: ``[t, j]`` is True if key ``j`` is held at
        query ``t`` (False above the diagonal).
    """
    b, hkv, length, _ = keys.shape
    logits = window_logits(query, keys, length, scaling)
    held = torch.zeros((b, hkv, length), dtype=torch.bool, device=keys.device)
    scores = torch.zeros((b, hkv, length), dtype=torch.float32, device=keys.device)
    mask = torch.zeros((b, hkv, length, length), dtype=torch.bool, device=keys.device)
    budget = heavy + recent
    for t in range(length):
        held[..., t] = True
        probs = torch.softmax(logits[..., t, :].masked_fill(~held.unsqueeze(2), float("-inf")), dim=-1)
        scores += probs.mean(dim=2)
        mask[..., t, :] = held
        if t + 1 > budget:
            candidates = held.clone()
            candidates[..., max(0, t + 1 - recent) :] = False
            held.scatter_(-1, lowest_score(scores, candidates).unsqueeze(-1), False)
    return mask


def student_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    keep: torch.Tensor,
    kernels: LessKernels,
    scaling: float,
) -> torch.Tensor:
    """LESS attention output for every position of a window (sparse softmax + low-rank term).

    ``o_t = [sum_{j in S_t} e^{l_tj} v_j + sum_{j in E_t} (phi(q_t) . psi(k_j)) v_j] /
    [sum_{S_t} e^{l_tj} + sum_{E_t} phi(q_t) . psi(k_j)]`` with ``S_t`` the held keys and ``E_t``
    the evicted causal keys, combined in log space as at inference (:class:`methods.less.LESS`).

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, length, head_dim]``.
    keys, values : torch.Tensor
        ``[batch, kv_heads, length, head_dim]``.
    keep : torch.Tensor
        ``[batch, kv_heads, length, length]`` bool from :func:`h2o_keep_mask`.
    kernels : LessKernels
        The layer's feature maps (trainable).
    scaling : float
        Softmax scale.

    Returns
    -------
    torch.Tensor
        ``[batch, q_heads, length, head_dim]`` float32.
    """
    b, hq, length, d = query.shape
    hkv = keys.shape[1]
    logits = window_logits(query, keys, length, scaling)  # causal, -inf above the diagonal
    causal = torch.ones(length, length, dtype=torch.bool, device=keys.device).tril()
    sparse = (keep & causal).unsqueeze(2)
    low_rank = (causal & ~keep).unsqueeze(2)
    lse_sparse = torch.logsumexp(logits.masked_fill(~sparse, float("-inf")), dim=-1)
    probs = torch.softmax(logits.masked_fill(~sparse, float("-inf")), dim=-1)
    phi = group_queries(kernels.phi(query.float()), hkv)  # [b, h, g, L, R]
    psi = kernels.psi(keys.float())  # [b, h, L, R]
    lr = torch.einsum("bhgqr,bhkr->bhgqk", phi, psi) * low_rank
    denom = lr.sum(dim=-1).clamp(min=1e-6)  # the official code's guard
    lse = torch.logaddexp(denom.log(), lse_sparse)
    v = values.float().unsqueeze(2)
    out = torch.exp(lse_sparse - lse).unsqueeze(-1) * (probs @ v) + torch.exp(-lse).unsqueeze(-1) * (lr @ v)
    return out.reshape(b, hq, length, d)


def lambda_keep_mask(
    length: int, heavy: int, recent: int, device: torch.device | None = None
) -> torch.Tensor:
    """The Lambda mask ``[length, length]`` bool: query ``t`` holds keys ``j < heavy`` and its
    ``recent`` newest keys ``t - recent < j <= t`` (LESS's second sparse policy)."""
    t = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (j <= t) & ((j < heavy) | (j > t - recent))
