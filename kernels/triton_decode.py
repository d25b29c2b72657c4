"""Fused Triton decode attention over a compressed cache (CUDA; ``TRITON_INTERPRET=1`` runs it on CPU).

One program per (batch, KV head) handles the whole query group of that KV head (GQA without
repeating KV): pass 1 streams the slots once with an online softmax (FlashAttention-style running
max and sum) for the output, pass 2 re-reads the keys to write the probabilities averaged over the
group and, optionally, the fused score update ``s <- decay * s + a`` (ZSMerge Eq. 5, H2O's
accumulation with ``decay = 1``). Inputs may be fp16/bf16/fp32; logits, softmax and the output
accumulate in fp32. The specification is :func:`kernels.decode_attention.decode_attention_torch`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_SLOTS = 64
# The CPU interpreter's tl.dot mishandles bfloat16 (loads are exact): there the bf16 dots run in fp32.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _logits(q, k, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    if IEEE:
        return tl.dot(q, tl.trans(k), input_precision="ieee")
    return tl.dot(q, tl.trans(k))


@triton.jit
def _block_logits(q, k_base, lw_base, s, smask, d, dmask, sk_s, sk_d, sl_s, HAS_BIAS: tl.constexpr,
                  IEEE: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """Raw logits ``[GROUP_P, BLOCK_S]`` of the block of slots ``s`` (valid where ``smask``), and the
    biased ones with ``-inf`` at invalid slots; also the block's ``[BLOCK_S, D_P]`` load mask."""
    kv_mask = smask[:, None] & dmask[None, :]
    k = tl.load(k_base + s[:, None] * sk_s + d[None, :] * sk_d, mask=kv_mask, other=0.0)
    raw = _logits(q, k, IEEE, UPCAST)
    biased = raw
    if HAS_BIAS:
        biased = raw + tl.load(lw_base + s * sl_s, mask=smask, other=0.0)[None, :]
    return raw, tl.where(smask[None, :], biased, float("-inf")), kv_mask


@triton.jit
def _weighted_values(p, v, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
    if IEEE:
        return tl.dot(p, v, input_precision="ieee")
    return tl.dot(p, v)


@triton.jit
def _load_query(q_ptr, sq_g, sq_d, scaling, dtype: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
                D: tl.constexpr, D_P: tl.constexpr):  # fmt: skip
    """The group's scaled query ``[GROUP_P, D_P]`` in ``dtype`` (0 in the padding) and its row and
    column indices and masks."""
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, D_P)
    gmask = g < GROUP
    dmask = d < D
    q = tl.load(
        q_ptr + g[:, None] * sq_g + d[None, :] * sq_d, mask=gmask[:, None] & dmask[None, :], other=0.0
    )
    return (q.to(tl.float32) * scaling).to(dtype), g, d, gmask, dmask


@triton.jit
def _online_softmax(m_i, l_i, acc, logits, v_ptr, kv_mask, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One block of pass 1: the running max ``m_i``, sum ``l_i`` and output ``acc`` after the block's
    ``logits`` ``[GROUP_P, BLOCK_S]`` and values at ``v_ptr`` (FlashAttention's online softmax)."""
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(logits - m_new[:, None])
    v = tl.load(v_ptr, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + _weighted_values(p.to(v.dtype), v, IEEE, UPCAST)
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc


@triton.jit
def _group_mean(logits, m_i, l_i, gmask, GROUP: tl.constexpr):
    """Pass 2: the block's probabilities ``[BLOCK_S]`` averaged over the group's query heads."""
    p = tl.exp(logits - m_i[:, None]) / l_i[:, None]
    return tl.sum(tl.where(gmask[:, None], p, 0.0), axis=0) / GROUP


@triton.jit
def _decode_kernel(
    Q, K, V, LW, OUT, P, S,
    sq_b, sq_h, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
    sl_b, sl_h, sl_s, so_b, so_h, so_d, sp_b, sp_h, sp_g, sp_s, ss_b, ss_h, ss_s,
    n_slots, scaling, decay,
    HKV: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_BIAS: tl.constexpr, LOGITS: tl.constexpr, FUSE_SCORE: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b = pid // HKV
    h = pid % HKV
    q_base = Q + b * sq_b + h * GROUP * sq_h
    q, g, d, gmask, dmask = _load_query(
        q_base, sq_h, sq_d, scaling, K.dtype.element_ty, GROUP, GROUP_P, D, D_P
    )
    k_base = K + b * sk_b + h * sk_h
    v_base = V + b * sv_b + h * sv_h
    lw_base = LW + b * sl_b + h * sl_h
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, D_P], tl.float32)
    for start in range(0, n_slots, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        smask = s < n_slots
        raw, logits, kv_mask = _block_logits(
            q, k_base, lw_base, s, smask, d, dmask, sk_s, sk_d, sl_s, HAS_BIAS, IEEE, UPCAST
        )
        if LOGITS:
            p_ptr = P + b * sp_b + h * sp_h + g[:, None] * sp_g + s[None, :] * sp_s
            tl.store(p_ptr, raw, mask=gmask[:, None] & smask[None, :])
        v_ptr = v_base + s[:, None] * sv_s + d[None, :] * sv_d
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, logits, v_ptr, kv_mask, IEEE, UPCAST)
    o_ptr = OUT + b * so_b + (h * GROUP + g)[:, None] * so_h + d[None, :] * so_d
    tl.store(o_ptr, (acc / l_i[:, None]).to(OUT.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
    if not LOGITS:
        for start in range(0, n_slots, BLOCK_S):
            s = start + tl.arange(0, BLOCK_S)
            smask = s < n_slots
            _, logits, _ = _block_logits(
                q, k_base, lw_base, s, smask, d, dmask, sk_s, sk_d, sl_s, HAS_BIAS, IEEE, UPCAST
            )
            mean = _group_mean(logits, m_i, l_i, gmask, GROUP)
            tl.store(P + b * sp_b + h * sp_h + s * sp_s, mean, mask=smask)
            if FUSE_SCORE:
                s_ptr = S + b * ss_b + h * ss_h + s * ss_s
                old = tl.load(s_ptr, mask=smask, other=0.0)
                tl.store(s_ptr, decay * old + mean, mask=smask)


def triton_decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    return_logits: bool = False,
    scores: torch.Tensor | None = None,
    decay: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel behind :func:`kernels.decode_attention.decode_attention` (one decode step).

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, 1, head_dim]``.
    keys, values : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``, any strides (views of the cache's buffers).
    log_weight : torch.Tensor | None
        ``[batch, kv_heads, slots]`` float32 bias (ZSMerge Eq. 8), or None.
    scaling : float
        Softmax scale.
    return_logits : bool
        Return the unbiased logits ``[batch, kv_heads, group, slots]`` instead of the probabilities.
    scores : torch.Tensor | None
        ``[batch, kv_heads, slots]`` float32 scores updated in place as
        ``scores = decay * scores + probs`` (not with ``return_logits``).
    decay : float
        ``lambda`` of that update.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        Output ``[batch, q_heads, 1, head_dim]`` in the query's dtype, and the float32 group-mean
        probabilities ``[batch, kv_heads, slots]`` (or the logits).

    Raises
    ------
    ValueError
        For more than one query token, or ``scores`` together with ``return_logits``.
    """
    b, hq, q_len, d = query.shape
    if q_len != 1:
        raise ValueError(f"the Triton decode kernel takes one query token, got {q_len}")
    if scores is not None and return_logits:
        raise ValueError("the fused score update needs probabilities, not logits")
    hkv, n = keys.shape[1], keys.shape[2]
    group = hq // hkv
    out = torch.empty_like(query)
    if return_logits:
        aux = torch.empty(b, hkv, group, n, device=query.device, dtype=torch.float32)
        sp = aux.stride()
    else:
        aux = torch.empty(b, hkv, n, device=query.device, dtype=torch.float32)
        sp = (aux.stride(0), aux.stride(1), 0, aux.stride(2))
    lw = log_weight if log_weight is not None else aux
    sc = scores if scores is not None else aux
    _decode_kernel[(b * hkv,)](
        query, keys, values, lw, out, aux, sc,
        query.stride(0), query.stride(1), query.stride(3),
        *keys.stride(), *values.stride(),
        lw.stride(0), lw.stride(1), lw.stride(-1),
        out.stride(0), out.stride(1), out.stride(3),
        *sp, sc.stride(0), sc.stride(1), sc.stride(-1),
        n, float(scaling), float(decay),
        HKV=hkv, GROUP=group, GROUP_P=max(16, triton.next_power_of_2(group)),
        D=d, D_P=max(16, triton.next_power_of_2(d)), BLOCK_S=BLOCK_SLOTS,
        HAS_BIAS=log_weight is not None, LOGITS=return_logits, FUSE_SCORE=scores is not None,
        IEEE=keys.dtype == torch.float32, UPCAST=keys.dtype == torch.bfloat16 and INTERPRETED,
    )  # fmt: skip
    return out, aux
