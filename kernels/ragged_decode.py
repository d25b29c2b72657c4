"""Decode attention over ragged heads: every (batch, KV head) segment holds its own number of slots.

The slots of all segments are packed in one buffer (``methods.seam.ragged``): slot ``t`` belongs to
segment ``segment[t]``; segment ``s`` owns the buffer range ``offsets[s] .. offsets[s] + capacity``
of which the first ``lengths[s]`` slots are valid. One query group (the query heads that share the
KV head, GQA/MQA) attends to its own segment only.

:func:`ragged_decode_attention_torch` is the specification and the CPU path: segment-wise softmax
with ``scatter_reduce_``/``index_add_``, so a step allocates one ``[total slots, group, head_dim]``
buffer and ``O(total slots x group)`` besides, nothing proportional to ``heads x max slots``.
:func:`ragged_decode_attention` runs the Triton kernel (``kernels.triton_ragged``, per-segment
lengths) where :func:`kernels.decode_attention.uses_triton` says so.
"""

from __future__ import annotations

import torch

from kernels.decode_attention import uses_triton


def ragged_decode_attention_torch(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    segment: torch.Tensor,
    valid: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    softcap: float | None = None,
    return_probs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One decode step of attention over packed ragged segments.

    Parameters
    ----------
    query : torch.Tensor
        ``[segments, group, head_dim]`` post-RoPE: the query heads of each (batch, KV head) segment.
    keys, values : torch.Tensor
        ``[slots, head_dim]`` packed buffers (every segment's capacity, valid or not).
    offsets, lengths : torch.Tensor
        ``[segments]`` int64: where each segment starts in the buffers and how many of its slots
        are valid (the Triton kernel reads these; the PyTorch path the next two).
    segment : torch.Tensor
        ``[slots]`` int64 segment of each buffer slot.
    valid : torch.Tensor
        ``[slots]`` bool: whether the slot holds a token (invalid slots get probability 0).
    log_weight : torch.Tensor | None
        ``[slots]`` float32 bias added to the logits, or None.
    scaling : float
        Softmax scale.
    softcap : float | None
        Logit soft-cap ``c`` (``c * tanh(logits / c)``), or None.
    return_probs : bool
        Whether to return the probabilities.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor | None]
        Output ``[segments, group, head_dim]`` in the query's dtype, and ``[slots]`` float32
        group-mean probabilities (0 at invalid slots), or None.
    """
    n_seg, group, head_dim = query.shape
    # One [slots, group, head_dim] float32 buffer: the scaled query gathered to each slot, multiplied
    # by the slot's key in place (logits = its sum over head_dim), then reused for p * v.
    buf = (query.float() * scaling).index_select(0, segment)
    logits = buf.mul_(keys.unsqueeze(1)).sum(-1)  # [slots, group]
    if softcap is not None:
        logits.div_(softcap).tanh_().mul_(softcap)
    if log_weight is not None:
        logits.add_(log_weight.unsqueeze(-1))
    logits.masked_fill_(~valid.unsqueeze(-1), float("-inf"))
    index = segment.unsqueeze(-1).expand_as(logits)
    peak = logits.new_full((n_seg, group), float("-inf")).scatter_reduce_(0, index, logits, "amax")
    probs = logits.sub_(peak.index_select(0, segment)).exp_()  # exp(-inf) = 0 at invalid slots
    total = probs.new_zeros((n_seg, group)).index_add_(0, segment, probs)
    torch.mul(probs.unsqueeze(-1), values.unsqueeze(1), out=buf)
    out = buf.new_zeros((n_seg, group, head_dim)).index_add_(0, segment, buf).div_(total.unsqueeze(-1))
    if not return_probs:
        return out.to(query.dtype), None
    return out.to(query.dtype), probs.div_(total.index_select(0, segment)).mean(-1)


def ragged_decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    segment: torch.Tensor,
    valid: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    softcap: float | None = None,
    return_probs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`ragged_decode_attention_torch` (same arguments and results); the Triton kernel takes
    over where one is registered for the query's device (``kernels.triton_ragged``)."""
    if softcap is None and uses_triton(query.unsqueeze(2)):
        try:
            from kernels.triton_ragged import triton_ragged_decode_attention
        except ImportError:
            pass
        else:
            return triton_ragged_decode_attention(
                query, keys, values, offsets, lengths, segment, valid, log_weight, scaling, return_probs
            )
    return ragged_decode_attention_torch(
        query, keys, values, offsets, lengths, segment, valid, log_weight, scaling, softcap, return_probs
    )
