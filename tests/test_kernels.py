"""The Triton decode kernel equals the PyTorch specification (CPU: ``TRITON_INTERPRET=1``, set in
conftest when there is no GPU), and generation with it equals generation without."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import decode_attention_torch, proof, set_backend, uses_triton

triton_decode = pytest.importorskip("kernels.triton_decode", reason="triton is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    set_backend("auto")


def make(batch, kv_heads, group, slots, head_dim, dtype, seed=0, bias=True, buffer_extra=0):
    """Query ``[b, kv*group, 1, d]``; keys/values as views of a larger preallocated buffer
    ``[b, kv, slots + extra, d]`` (the cache's layout); a log-weight bias of merged slots."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, 1, head_dim, generator=g).to(DEVICE, dtype)
    kbuf = torch.randn(batch, kv_heads, slots + buffer_extra, head_dim, generator=g).to(DEVICE, dtype)
    vbuf = torch.randn(batch, kv_heads, slots + buffer_extra, head_dim, generator=g).to(DEVICE, dtype)
    lw = (torch.rand(batch, kv_heads, slots, generator=g) * 2).log().to(DEVICE) if bias else None
    return q, kbuf[:, :, :slots], vbuf[:, :, :slots], lw


SHAPES = [  # batch, kv_heads, group, slots, head_dim
    (1, 3, 3, 1, 64),  # SmolLM2: 9 query heads on 3 KV heads
    (1, 3, 3, 37, 64),
    (2, 2, 4, 130, 16),
    (2, 1, 8, 5, 32),
    (1, 4, 1, 64, 48),  # MHA, head_dim not a power of two
    (3, 2, 3, 129, 64),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_equals_the_pytorch_path(shape, dtype):
    b, hkv, group, n, d = shape
    q, k, v, lw = make(b, hkv, group, n, d, dtype, buffer_extra=7)
    out, probs = triton_decode.triton_decode_attention(q, k, v, lw, d**-0.5)
    ref_out, ref_probs = decode_attention_torch(q, k, v, lw, d**-0.5)
    assert out.dtype == dtype and out.shape == (b, hkv * group, 1, d) and probs.shape == (b, hkv, n)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=TOL[dtype] * 4, rtol=TOL[dtype] * 4)
    torch.testing.assert_close(probs, ref_probs, atol=TOL[dtype], rtol=TOL[dtype] * 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(b, hkv, device=DEVICE), atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", SHAPES[1:4])
def test_kernel_logits_and_no_bias_equal_the_pytorch_path(shape):
    b, hkv, group, n, d = shape
    q, k, v, _ = make(b, hkv, group, n, d, torch.float32, bias=False)
    out, logits = triton_decode.triton_decode_attention(q, k, v, None, d**-0.5, return_logits=True)
    ref_out, ref_logits = decode_attention_torch(q, k, v, None, d**-0.5, return_logits=True)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decay", [1.0, 0.98])
def test_fused_score_update_equals_eq5(decay):
    """``s <- lambda * s + a`` with ``a`` the group-mean probabilities (ZSMerge Eq. 5)."""
    q, k, v, lw = make(2, 3, 3, 41, 64, torch.float16)
    old = torch.rand(2, 3, 41, device=DEVICE)
    scores, expected = old.clone(), old.clone()
    _, ref_probs = decode_attention_torch(q, k, v, lw, 0.125, scores=expected, decay=decay)
    _, probs = triton_decode.triton_decode_attention(q, k, v, lw, 0.125, scores=scores, decay=decay)
    torch.testing.assert_close(expected, decay * old + ref_probs)  # the specification is Eq. 5
    torch.testing.assert_close(scores, decay * old + probs)  # the kernel wrote what it returned
    torch.testing.assert_close(scores, expected, atol=2e-3, rtol=2e-3)


def test_bad_calls_raise():
    q, k, v, lw = make(1, 1, 2, 4, 16, torch.float32)
    with pytest.raises(ValueError, match="one query token"):
        triton_decode.triton_decode_attention(torch.cat([q, q], dim=2), k, v, lw, 0.25)
    with pytest.raises(ValueError, match="needs probabilities"):
        triton_decode.triton_decode_attention(q, k, v, lw, 0.25, True, torch.zeros(1, 1, 4))
    with pytest.raises(ValueError, match="kernels must be one of"):
        set_backend("cuda")


def test_backend_selection():
    q = torch.zeros(1, 3, 1, 8)
    assert not uses_triton(q)  # auto: PyTorch on CPU
    set_backend("triton")
    assert uses_triton(q) and not uses_triton(torch.zeros(1, 3, 2, 8))  # one token only
    set_backend("torch")
    assert not uses_triton(q)
    assert kernels.get_backend() == "torch"


@pytest.mark.parametrize("method_name", ["zsmerge", "h2o", "keepkv", "streamingllm"])
def test_generation_with_the_kernel_equals_generation_without(tiny_model, method_name, monkeypatch):
    from methods import METHOD_REGISTRY
    from runners.generation.greedy import greedy_generate

    calls = []
    kernel = triton_decode.triton_decode_attention
    monkeypatch.setattr(triton_decode, "triton_decode_attention", lambda *a: calls.append(1) or kernel(*a))
    monkeypatch.setattr(proof, "VERDICTS", {})  # each kernel variant is proven once (one call each)
    method = METHOD_REGISTRY[method_name]()
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    runs = {}
    for backend in ("torch", "triton"):
        set_backend(backend)
        runs[backend] = greedy_generate(tiny_model, ids, method, 16, 24, eos_token_ids=set())
    # every decode step of both layers ran the kernel; StreamingLLM needs no probabilities (SDPA)
    assert len(calls) == (0 if method_name == "streamingllm" else 2 * 23 + len(proof.VERDICTS))
    assert runs["triton"].tokens == runs["torch"].tokens
    assert runs["triton"].slots == runs["torch"].slots
