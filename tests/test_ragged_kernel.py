"""Decode attention over ragged heads: the PyTorch paths (the specification and the CPU's per-segment
products) against a plain per-segment softmax in float64, the
Triton kernel (CPU: ``TRITON_INTERPRET=1``, set in conftest when there is no GPU) against the
PyTorch path, and the PyTorch path's memory against ``total slots``, not ``heads x max slots``."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kernels import proof, set_backend
from kernels.ragged_decode import (
    packed_case,
    per_segment_attention,
    ragged_decode_attention,
    ragged_decode_attention_torch,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LENGTHS = [5, 1, 70, 12]  # a single-slot segment, one longer than a kernel block (64 slots)


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    set_backend("auto")


def make(lengths, group, head_dim, dtype=torch.float32, tail=3, bias=True, seed=0):
    """Packed ragged inputs (``kernels.ragged_decode.packed_case``: ``tail`` invalid slots per
    segment filled with large values that must not count; keys a strided view of a wider buffer) on
    ``DEVICE``, query, keys and values in ``dtype``.

    Returns ``(query [segments, group, head_dim], keys, values [slots, head_dim], offsets, lengths,
    segment, valid [slots], log_weight [slots] or None)``.
    """
    case = packed_case(lengths, group, head_dim, tail, torch.Generator().manual_seed(seed))
    query, keys, values, *index, log_weight = (t.to(DEVICE) for t in case)
    return (
        *(t.to(dtype) for t in (query, keys, values)), *index, log_weight if bias else None,
    )  # fmt: skip


def naive(query, keys, values, offsets, lengths, log_weight, scaling, softcap):
    """A softmax over each segment's valid slots, one segment at a time, in float64 on the CPU."""
    query, keys, values = (t.cpu().double() for t in (query, keys, values))
    out = torch.zeros(query.shape, dtype=torch.float64)
    probs = torch.zeros(keys.shape[0], dtype=torch.float64)
    for s in range(query.shape[0]):
        rows = slice(int(offsets[s]), int(offsets[s] + lengths[s]))
        logits = query[s] @ keys[rows].T * scaling  # [group, length]
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        if log_weight is not None:
            logits = logits + log_weight[rows].cpu().double()
        p = torch.softmax(logits, dim=-1)
        out[s] = p @ values[rows]
        probs[rows] = p.mean(0)
    return out, probs


def per_segment(q, k, v, offsets, lengths, segment, valid, lw, scaling, softcap=None, return_probs=True):
    """:func:`per_segment_attention` (CPU tensors) called as :func:`ragged_decode_attention_torch`."""
    args = (t.cpu() if t is not None else None for t in (q, k, v, offsets, lengths, lw))
    out, probs = per_segment_attention(*args, scaling, softcap, return_probs)
    return out.to(q.device), None if probs is None else probs.to(q.device)


@pytest.mark.parametrize("path", [ragged_decode_attention_torch, per_segment], ids=["spec", "per_segment"])
@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("bias", [True, False])
def test_pytorch_path_equals_a_per_segment_softmax(bias, softcap, path):
    q, k, v, offsets, lengths, segment, valid, lw = make(LENGTHS, 3, 16, bias=bias)
    out, probs = path(q, k, v, offsets, lengths, segment, valid, lw, 0.25, softcap)
    ref_out, ref_probs = naive(q, k, v, offsets, lengths, lw, 0.25, softcap)
    assert out.shape == q.shape and out.dtype == q.dtype and probs.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs.cpu().double(), ref_probs, atol=1e-5, rtol=1e-5)
    assert torch.all(probs[~valid] == 0)
    sums = torch.zeros(len(LENGTHS), device=DEVICE).index_add_(0, segment, probs)
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)
    no_probs, none = path(q, k, v, offsets, lengths, segment, valid, lw, 0.25, softcap, return_probs=False)
    assert none is None
    torch.testing.assert_close(no_probs, out, atol=1e-6, rtol=1e-6)


triton_ragged = pytest.importorskip("kernels.triton_ragged", reason="triton is not installed")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_equals_the_pytorch_path(dtype, bias):
    inputs = make(LENGTHS, 3, 16, dtype, bias=bias)
    q, k, v, offsets, lengths, _, valid, lw = inputs
    out, probs = triton_ragged.triton_ragged_decode_attention(q, k, v, offsets, lengths, lw, 0.25, True)
    ref_out, ref_probs = ragged_decode_attention_torch(*inputs, 0.25)
    assert out.dtype == dtype and out.shape == inputs[0].shape and probs.shape == ref_probs.shape
    torch.testing.assert_close(out.float(), ref_out.float(), atol=TOL[dtype] * 4, rtol=TOL[dtype] * 4)
    torch.testing.assert_close(probs, ref_probs, atol=TOL[dtype], rtol=TOL[dtype] * 4)
    assert torch.all(probs[~valid] == 0)  # the invalid tail of every segment
    only_out, none = triton_ragged.triton_ragged_decode_attention(q, k, v, offsets, lengths, lw, 0.25, False)
    assert none is None and torch.equal(only_out, out)


def test_dispatch_takes_the_kernel_unless_soft_capped(monkeypatch):
    calls = []
    kernel = triton_ragged.triton_ragged_decode_attention
    monkeypatch.setattr(
        triton_ragged, "triton_ragged_decode_attention", lambda *a: calls.append(1) or kernel(*a)
    )
    monkeypatch.setattr(proof, "VERDICTS", {})  # the kernel is proven once (one call)
    inputs = make([3, 1, 4], 2, 16)
    set_backend("triton")
    out, _ = ragged_decode_attention(*inputs, 0.25)
    capped, _ = ragged_decode_attention(*inputs, 0.25, softcap=30.0)
    assert len(calls) == 2
    want = ragged_decode_attention_torch(*inputs, 0.25, softcap=30.0)[0]
    torch.testing.assert_close(capped, want, atol=1e-5, rtol=1e-5)
    set_backend("torch")
    torch.testing.assert_close(ragged_decode_attention(*inputs, 0.25)[0], out, atol=1e-5, rtol=1e-5)
    assert len(calls) == 2


class _Allocations(TorchDispatchMode):
    """Records the bytes of every new storage an op returns (views and in-place results share an
    argument's storage and are not new)."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        given = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(result):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.sizes.append(t.untyped_storage().nbytes())
        return result


@pytest.mark.parametrize("path", [ragged_decode_attention_torch, per_segment], ids=["spec", "per_segment"])
def test_pytorch_path_allocates_by_total_slots_not_heads_times_longest(path):
    """One long segment and many single-slot ones: anything padded to ``heads x max slots`` (a
    padded logits ``[heads, group, max]`` or keys ``[heads, max, head_dim]``) exceeds the bound."""
    heads, longest, group, head_dim = 128, 1024, 3, 8
    inputs = make([longest] + [1] * (heads - 1), group, head_dim, tail=0)
    total = inputs[1].shape[0]
    bound = total * group * head_dim * 4  # bytes of one float32 [slots, group, head_dim] tensor
    assert heads * longest * 4 > 3 * bound  # the geometry tells padded from packed
    with _Allocations() as allocations:
        path(*inputs, 0.25)
    assert max(allocations.sizes) <= bound
    # every temporary together, live or not: one [slots, group, head_dim] buffer, O(slots x group) besides
    assert sum(allocations.sizes) <= 2 * bound
