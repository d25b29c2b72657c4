"""Triton decode attention over ragged heads (CUDA; ``TRITON_INTERPRET=1`` runs it on CPU).

Every (batch, KV head) segment holds its own number of slots, packed in one buffer
(``kernels.ragged_decode``). One program per segment handles that segment's whole query group (GQA
without repeating KV) and reads only its ``lengths[s]`` valid slots, so a step costs the total number
of valid slots, never ``segments x longest segment``: pass 1 streams the slots with an online softmax
(FlashAttention-style running max and sum) for the output, pass 2 re-reads the keys to write the
probabilities averaged over the group. Inputs may be fp16/bf16/fp32; logits, softmax and the output
accumulate in fp32. The specification is :func:`kernels.ragged_decode.ragged_decode_attention_torch`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_decode import (
    BLOCK_SLOTS,
    INTERPRETED,
    _block_logits,
    _group_mean,
    _load_query,
    _online_softmax,
)


@triton.jit
def _ragged_kernel(
    Q, K, V, LW, OFF, LEN, OUT, P,
    sq_s, sq_g, sq_d, sk_s, sk_d, sv_s, sv_d, sl_s, so_s, so_g, so_d,
    scaling,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_BIAS: tl.constexpr, PROBS: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    seg = tl.program_id(0)
    start_slot = tl.load(OFF + seg)
    n_slots = tl.load(LEN + seg)
    q, g, d, gmask, dmask = _load_query(
        Q + seg * sq_s, sq_g, sq_d, scaling, K.dtype.element_ty, GROUP, GROUP_P, D, D_P
    )
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, D_P], tl.float32)
    for block in range(0, n_slots, BLOCK_S):
        i = block + tl.arange(0, BLOCK_S)
        s = start_slot + i
        _, logits, kv_mask = _block_logits(
            q, K, LW, s, i < n_slots, d, dmask, sk_s, sk_d, sl_s, HAS_BIAS, IEEE, UPCAST
        )
        v_ptr = V + s[:, None] * sv_s + d[None, :] * sv_d
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, logits, v_ptr, kv_mask, IEEE, UPCAST)
    o_ptr = OUT + seg * so_s + g[:, None] * so_g + d[None, :] * so_d
    tl.store(o_ptr, (acc / l_i[:, None]).to(OUT.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
    if PROBS:
        for block in range(0, n_slots, BLOCK_S):
            i = block + tl.arange(0, BLOCK_S)
            smask = i < n_slots
            s = start_slot + i
            _, logits, _ = _block_logits(
                q, K, LW, s, smask, d, dmask, sk_s, sk_d, sl_s, HAS_BIAS, IEEE, UPCAST
            )
            tl.store(P + s, _group_mean(logits, m_i, l_i, gmask, GROUP), mask=smask)


def triton_ragged_decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    return_probs: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Triton kernel behind :func:`kernels.ragged_decode.ragged_decode_attention` (one decode
    step over packed ragged segments; no soft-cap, which takes the PyTorch path).

    Parameters
    ----------
    query : torch.Tensor
        ``[segments, group, head_dim]`` post-RoPE: the query heads of each (batch, KV head) segment.
    keys, values : torch.Tensor
        ``[slots, head_dim]`` packed buffers, any strides.
    offsets, lengths : torch.Tensor
        ``[segments]`` integer: the first buffer slot of each segment and its number of valid slots
        (at least 1: a decode step has appended its token); the kernel reads slots
        ``offsets[s] .. offsets[s] + lengths[s]`` only (the PyTorch path's ``segment`` and ``valid``
        say the same).
    log_weight : torch.Tensor | None
        ``[slots]`` float32 bias added to the logits, or None.
    scaling : float
        Softmax scale.
    return_probs : bool
        Whether to write the probabilities (the second pass over the keys).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor | None]
        Output ``[segments, group, head_dim]`` in the query's dtype, and ``[slots]`` float32
        group-mean probabilities (0 at every slot outside the segments' valid ranges), or None.
    """
    n_seg, group, d = query.shape
    out = torch.empty_like(query)
    probs = torch.zeros(keys.shape[0], device=query.device, dtype=torch.float32) if return_probs else None
    aux = probs if probs is not None else out  # a pointer for the arguments a call does not use
    lw = log_weight if log_weight is not None else aux
    _ragged_kernel[(n_seg,)](
        query, keys, values, lw, offsets, lengths, out, aux,
        *query.stride(), *keys.stride(), *values.stride(), lw.stride(-1), *out.stride(),
        float(scaling),
        GROUP=group, GROUP_P=max(16, triton.next_power_of_2(group)),
        D=d, D_P=max(16, triton.next_power_of_2(d)), BLOCK_S=BLOCK_SLOTS,
        HAS_BIAS=log_weight is not None, PROBS=return_probs,
        IEEE=keys.dtype == torch.float32, UPCAST=keys.dtype == torch.bfloat16 and INTERPRETED,
    )  # fmt: skip
    return out, probs
