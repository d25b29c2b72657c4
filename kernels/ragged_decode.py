"""Decode attention over ragged heads: every (batch, KV head) segment holds its own number of slots.

The slots of all segments are packed in one buffer (``methods.seam.ragged``): slot ``t`` belongs to
segment ``segment[t]``; segment ``s`` owns the buffer range ``offsets[s] .. offsets[s] + capacity``
of which the first ``lengths[s]`` slots are valid. One query group (the query heads that share the
KV head, GQA/MQA) attends to its own segment only.

:data:`ragged_decode_attention_torch` is the specification and the path of other devices without the
kernel: segment-wise softmax with ``scatter_reduce_``/``index_add_``, so a step allocates one
``[total slots, group, head_dim]`` buffer and ``O(total slots x group)`` besides, nothing proportional
to ``heads x max slots``, and never synchronises with the host. :func:`ragged_decode_attention` runs
the Triton kernel (``kernels.triton_ragged``, per-segment lengths) instead where the backend asks for
it and the kernel passed its proof (``kernels.proof``), and on the CPU (eager) two BLAS products per
segment over its slice of the buffers (:func:`per_segment_attention`), as the uniform path takes per
KV head: the elementwise passes of the specification cost 2-4x that.
"""

from __future__ import annotations

from functools import partial

import torch

from kernels.proof import CASES, Case, triton_proven, triton_wanted
from kernels.switch import RAN


def ragged_decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    segment: torch.Tensor,
    valid: torch.Tensor | None,
    log_weight: torch.Tensor | None,
    scaling: float,
    softcap: float | None = None,
    return_probs: bool = True,
    spec: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One decode step of attention over packed ragged segments; the Triton kernel
    (``kernels.triton_ragged``) computes it instead where the backend asks for it and the kernel passed
    its proof for these inputs (``kernels.proof``), except with a soft-cap or keys narrower than values
    (ThinK's). Noted in
    ``kernels.switch.RAN`` under ``ragged``.

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
    valid : torch.Tensor | None
        ``[slots]`` bool: whether the slot holds a token (invalid slots get probability 0); None:
        derived from ``offsets``, ``lengths`` and ``segment`` where needed (only the specification
        reads it, so a caller that may take the CPU or Triton path need not build it every step).
    log_weight : torch.Tensor | None
        ``[slots]`` float32 bias added to the logits, or None.
    scaling : float
        Softmax scale.
    softcap : float | None
        Logit soft-cap ``c`` (``c * tanh(logits / c)``), or None.
    return_probs : bool
        Whether to return the probabilities.
    spec : bool
        Run the PyTorch specification only (:data:`ragged_decode_attention_torch`): no kernel, nothing
        noted.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor | None]
        Output ``[segments, group, head_dim]`` in the query's dtype, and ``[slots]`` float32
        group-mean probabilities (0 at invalid slots), or None.

    Raises
    ------
    kernels.proof.KernelProofError
        With ``kernels=triton``, if the kernel failed its proof.
    """
    if not spec and softcap is None and triton_wanted(query.device) and values.shape[-1] == query.shape[-1]:
        _, group, d = query.shape
        options = {"probs": return_probs, "bias": log_weight is not None}
        if triton_proven("ragged", query.device, query.dtype, d, group, **options):
            from kernels import triton_ragged

            RAN.note("ragged", "triton")
            return triton_ragged.triton_ragged_decode_attention(
                query, keys, values, offsets, lengths, log_weight, scaling, return_probs
            )
    if not spec:
        RAN.note("ragged", "torch")
        if query.device.type == "cpu" and not torch.compiler.is_compiling():
            return per_segment_attention(
                query, keys, values, offsets, lengths, log_weight, scaling, softcap, return_probs
            )
    n_seg, group, head_dim = query.shape
    if valid is None:
        local = torch.arange(len(segment), device=segment.device) - offsets.index_select(0, segment)
        valid = local < lengths.index_select(0, segment)
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


def per_segment_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
    return_probs: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`ragged_decode_attention` one segment at a time, in float32: ``q k^T`` and ``p v`` over
    the segment's valid slots (``keys[offsets[s] : offsets[s] + lengths[s]]``, a view). Reads the
    offsets and lengths on the host (a synchronisation, free on the CPU); the CPU's eager path.
    Arguments and returns as :func:`ragged_decode_attention`'s (the segments' valid slots are their
    first ``lengths[s]``, so ``segment`` and ``valid`` are not needed)."""
    q = (query.float() * scaling).unbind(0)
    rows = []
    probs = q[0].new_zeros(keys.shape[0]) if return_probs else None
    # float32 buffers are read as they are (a .float() per slice would dispatch an op per segment)
    widen = keys.dtype != torch.float32 or values.dtype != torch.float32
    for s, (start, n) in enumerate(zip(offsets.tolist(), lengths.tolist(), strict=True)):
        k, v = keys[start : start + n], values[start : start + n]
        if widen:
            k, v = k.float(), v.float()
        logits = torch.mm(q[s], k.t())  # [group, n]
        if softcap is not None:
            logits.div_(softcap).tanh_().mul_(softcap)
        if log_weight is not None:
            logits.add_(log_weight[start : start + n])
        p = torch.softmax(logits, -1)
        rows.append(torch.mm(p, v))
        if probs is not None:
            torch.mean(p, 0, out=probs[start : start + n])
    out = torch.stack(rows)
    return (out if query.dtype == torch.float32 else out.to(query.dtype)), probs


#: :func:`ragged_decode_attention` with ``spec=True``, same arguments: the specification, the reference
#: of the kernel's proof and of :func:`per_segment_attention`.
ragged_decode_attention_torch = partial(ragged_decode_attention, spec=True)


def packed_case(
    lengths: list[int], group: int, head_dim: int, tail: int, generator: torch.Generator
) -> tuple[torch.Tensor, ...]:
    """Packed ragged inputs on the CPU in float32: segment ``s`` holds ``lengths[s]`` valid slots,
    then ``tail`` invalid ones filled with large values that must not count; keys are a strided view
    of a wider buffer.

    Returns
    -------
    tuple[torch.Tensor, ...]
        ``query [segments, group, head_dim]``, ``keys``, ``values [slots, head_dim]``, ``offsets``,
        ``lengths [segments]``, ``segment``, ``valid``, ``log_weight [slots]``.
    """
    length = torch.tensor(lengths)
    capacity = length + tail
    offsets = torch.cumsum(capacity, 0) - capacity
    n = int(capacity.sum())
    segment = torch.repeat_interleave(torch.arange(len(lengths)), capacity)
    valid = torch.arange(n) - offsets[segment] < length[segment]
    query = torch.randn(len(lengths), group, head_dim, generator=generator)
    keys = torch.randn(n, head_dim + 5, generator=generator)[:, :head_dim]
    values = torch.randn(n, head_dim, generator=generator)
    keys[~valid], values[~valid] = 1e4, 1e4
    log_weight = (torch.rand(n, generator=generator) * 2).log()
    return query, keys, values, offsets, length, segment, valid, log_weight


def _proof_case(
    device: torch.device, dtype: torch.dtype, head_dim: int, group: int, probs: bool, bias: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The kernel and :func:`ragged_decode_attention_torch` on one small case (``kernels.proof``):
    segments of 70, 1 and 12 valid slots (a full kernel block and a partial one) and 3 invalid ones."""
    from kernels import triton_ragged  # looked up per proof: a test may swap the kernel

    case = packed_case([70, 1, 12], group, head_dim, 3, torch.Generator().manual_seed(0))
    query, keys, values, offsets, lengths, segment, valid, log_weight = (t.to(device) for t in case)
    query, keys, values = (t.to(dtype) for t in (query, keys, values))
    packed, rest = (query, keys, values, offsets, lengths), (log_weight if bias else None, head_dim**-0.5)
    got = triton_ragged.triton_ragged_decode_attention(*packed, *rest, probs)  # called as the dispatch does
    want = ragged_decode_attention_torch(*packed, segment, valid, *rest, None, probs)
    return [(got[0], want[0])] + ([(got[1], want[1])] if probs else [])


#: Every option set :func:`ragged_decode_attention` may pass to the kernel.
CASES["ragged"] = Case(
    _proof_case, tuple({"probs": probs, "bias": bias} for probs in (False, True) for bias in (False, True))
)
