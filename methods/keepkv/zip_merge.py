"""KeepKV merging arithmetic (Tian et al., "KeepKV", Sec. 3.3).

ZIP-Merging (Eq. 7 / Algorithm 1 lines 8-10) of evicted tokens into retained ones, for many
groups at once and in the log domain (scores ``s = exp(q k^T * scaling)`` overflow float32 for
large logits, so every quantity is carried as a logarithm). For one evicted token ``e`` merged
into ``c`` it is exactly Eq. 7; for several tokens merged into one retained token it is the same
formula with sums over the group, which keeps Theorem 3 (``p_r s_r = sum_i p_i s_i`` and
``v_r = sum_i w_i v_i / sum_i w_i`` with ``w_i = p_i s_i``).

Divide Eq. 7's numerator and denominator by ``W = sum_i w_i``:
``k_r = f * sum_i lam_i k_i`` with convex weights ``lam_i = w_i / W`` and
``f = ln(W / P) / sum_i lam_i ln s_i`` (``P = sum_i p_i``). The merged token's score is
``s_r = W / P``, so a merged slot carries the weighted mean of its members' scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GroupMerge:
    """Merged slots ``[batch, kv_heads, groups, ...]`` returned by :func:`merge_groups`.

    Attributes
    ----------
    keys, values : torch.Tensor
        ``[batch, kv_heads, groups, head_dim]`` in the arithmetic dtype (``merge_groups``' ``dtype``).
    log_votes : torch.Tensor
        ``[batch, kv_heads, groups]`` ``ln P``: Electoral Votes of each merged slot (Eq. 6).
    log_score : torch.Tensor
        ``[batch, kv_heads, groups]`` ``ln(W / P)``: the merged slot's score estimate.
    merged : torch.Tensor
        ``[batch, kv_heads, groups]`` bool: the group has more than one member.
    fallback : torch.Tensor
        ``[batch, kv_heads, groups]`` bool: a merged group whose ZIP key factor failed the guard
        and which got the convex average instead.
    """

    keys: torch.Tensor
    values: torch.Tensor
    log_votes: torch.Tensor
    log_score: torch.Tensor
    merged: torch.Tensor
    fallback: torch.Tensor


@dataclass
class MergeGroups:
    """A merge's groups: the slots taking part, their votes and the merged slot each goes to.

    Attributes
    ----------
    members : torch.Tensor
        ``[batch, kv_heads, n]`` int64 slots taking part.
    log_votes : torch.Tensor
        ``[batch, kv_heads, n]`` ``ln p`` of each member; ``-inf`` excludes it (evicted, not merged).
    target : torch.Tensor
        ``[batch, kv_heads, n]`` int64 group of each member in ``[0, groups)``.
    groups : int
        Number of merged slots.
    """

    members: torch.Tensor
    log_votes: torch.Tensor
    target: torch.Tensor
    groups: int


def group_sum(x: torch.Tensor, target: torch.Tensor, groups: int) -> torch.Tensor:
    """Sum of ``x`` ``[b, h, n, *extra]`` over members with equal ``target`` ``[b, h, n]``:
    ``[b, h, groups, *extra]`` (one group: a plain sum, the decode step's pair)."""
    if groups == 1:
        return x.sum(dim=2, keepdim=True)
    index = target.view(*target.shape, *([1] * (x.dim() - 3))).expand_as(x)
    return x.new_zeros((*x.shape[:2], groups, *x.shape[3:])).scatter_add(2, index, x)


#: Up to this many terms, :func:`small_logsumexp` chains ``logaddexp`` (one elementwise op per
#: term) instead of ``torch.logsumexp`` (max, subtract, exp, sum, log, add: about 15 us on a CPU
#: for the few elements of a decode step).
SMALL_TERMS = 8


def small_logsumexp(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """``log sum exp`` of ``x`` over ``dim`` (the result has ``x``'s shape without ``dim``, or with it
    as size 1 for ``keepdim``); a ``logaddexp`` chain for 2 to :data:`SMALL_TERMS` terms (a decode
    step's GQA group, a merge pair), else ``torch.logsumexp``. Equal up to rounding; ``-inf`` terms
    contribute nothing, all ``-inf`` gives ``-inf``."""
    n = x.shape[dim]
    if n <= 1 or n > SMALL_TERMS:
        return torch.logsumexp(x, dim=dim, keepdim=keepdim)
    terms = x.unbind(dim)
    out = torch.logaddexp(terms[0], terms[1])
    for term in terms[2:]:
        out = torch.logaddexp(out, term)
    return out.unsqueeze(dim) if keepdim else out


def group_logsumexp(x: torch.Tensor, target: torch.Tensor, groups: int) -> torch.Tensor:
    """``log sum exp`` of ``x`` ``[b, h, n, *extra]`` over members with equal ``target`` ``[b, h, n]``."""
    if groups == 1:
        return small_logsumexp(x, dim=2, keepdim=True)
    extra = x.shape[3:]
    index = target.view(*target.shape, *([1] * len(extra))).expand_as(x)
    shape = (*x.shape[:2], groups, *extra)
    peak = x.new_full(shape, float("-inf")).scatter_reduce(2, index, x, "amax", include_self=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    return torch.log(group_sum(torch.exp(x - peak.gather(2, index)), target, groups)) + peak


def spread(g: torch.Tensor, target: torch.Tensor, groups: int) -> torch.Tensor:
    """Each member's group value: ``g`` ``[b, h, groups]`` at ``target`` ``[b, h, n]``."""
    return g if groups == 1 else g.gather(2, target)


def merge_groups(
    keys: torch.Tensor,
    values: torch.Tensor,
    log_votes: torch.Tensor,
    log_score: torch.Tensor,
    target: torch.Tensor,
    groups: int,
    zip_keys: bool = True,
    guard: float | torch.Tensor = 1e-3,
    max_factor: float | torch.Tensor = 4.0,
    merged: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> GroupMerge:
    """Merge slots into ``groups`` slots by ZIP-Merging (KeepKV Eq. 7) or the convex average.

    Parameters
    ----------
    keys, values : torch.Tensor
        ``[batch, kv_heads, n, head_dim]`` members (any float dtype; computed in ``dtype``).
    log_votes : torch.Tensor
        ``[batch, kv_heads, n]`` ``ln p``; ``-inf`` excludes a member (evicted, not merged).
    log_score : torch.Tensor
        ``[batch, kv_heads, n]`` ``ln s`` (KeepKV's unnormalised scores, or their Eq. 8 estimate).
    target : torch.Tensor
        ``[batch, kv_heads, n]`` int64 group of each member in ``[0, groups)``; every group needs
        at least one member with finite ``log_votes``.
    groups : int
        Number of merged slots.
    zip_keys : bool
        True: Eq. 7 key scaling; False: convex weighted average of the keys (official code).
    guard, max_factor : float | torch.Tensor
        ZIP falls back to the convex key when ``|sum_i lam_i ln s_i| < guard`` or the factor is
        outside ``(0, max_factor]`` (docs/methods.md, "KeepKV"); numbers, or 0-d tensors holding
        them (no scalar wrapping per op).
    merged : torch.Tensor | None
        ``[batch, kv_heads, groups]`` bool: which groups have more than one member, when the caller
        knows (a decode step's pair: whether the victim merges); None: counted from ``log_votes``.
    dtype : torch.dtype
        Arithmetic dtype: float64 (default; a prefill's groups sum many members), float32 for a
        decode step's pair.

    Returns
    -------
    GroupMerge
    """
    keys, values, log_votes, log_score = (
        t if t.dtype == dtype else t.to(dtype) for t in (keys, values, log_votes, log_score)
    )
    log_w = log_votes + log_score
    log_total = group_logsumexp(log_w, target, groups)  # ln W
    log_p = group_logsumexp(log_votes, target, groups)  # ln P
    lam = torch.exp(log_w - spread(log_total, target, groups))  # 0 for excluded members
    weight = lam.unsqueeze(-1)
    k_bar = group_sum(weight * keys, target, groups)
    v_bar = group_sum(weight * values, target, groups)
    if merged is None:
        merged = group_sum(torch.isfinite(log_votes).to(dtype), target, groups) > 1
    log_s_r = log_total - log_p
    if not zip_keys:
        return GroupMerge(k_bar, v_bar, log_p, log_s_r, merged, torch.zeros_like(merged))
    # sum_i lam_i ln s_i, excluded members (lam = 0, ln s maybe -inf: NaN) adding 0
    terms = lam * log_score
    if groups == 1:
        denom = terms.nansum(dim=2, keepdim=True)
    else:
        denom = group_sum(
            torch.nan_to_num(terms, nan=0.0, posinf=float("inf"), neginf=float("-inf")), target, groups
        )
    factor = log_s_r / denom
    ok = (denom.abs() >= guard) & (factor > 0.0) & (factor <= max_factor)  # NaN fails both bounds
    scaled = merged & ok
    k_bar = torch.where(scaled.unsqueeze(-1), k_bar * factor.unsqueeze(-1), k_bar)
    return GroupMerge(k_bar, v_bar, log_p, log_s_r, merged, merged ^ scaled)  # fallback: merged & ~ok
