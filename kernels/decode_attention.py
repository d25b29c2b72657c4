"""Decode attention over a compressed cache: one query per head, per-slot log-weight bias.

:func:`decode_attention_torch` is the specification of the decode step and the CPU path;
:func:`decode_attention` runs the fused Triton kernel (``kernels.triton_decode``) instead for
one-token CUDA queries unless the backend is set to ``torch`` (config ``kernels=torch``). GQA is
handled by grouping query heads onto their KV head, never by repeating KV.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from kernels.switch import Switch

BACKENDS = ("auto", "torch", "triton")
#: ``kernels=auto`` (Triton on CUDA when triton is installed, PyTorch otherwise), ``torch`` (always
#: the PyTorch path) or ``triton`` (always the kernel; on CPU only under ``TRITON_INTERPRET=1``).
BACKEND = Switch("kernels", BACKENDS, "auto")
set_backend, get_backend = BACKEND.set, BACKEND.get


@functools.cache
def triton_available() -> bool:
    """Whether the triton package is installed (looked up once: this sits on the decode path)."""
    return importlib.util.find_spec("triton") is not None


def uses_triton(query: torch.Tensor) -> bool:
    """Whether :func:`decode_attention` runs the Triton kernel for this query."""
    if BACKEND.value == "torch" or query.shape[2] != 1:
        return False
    if BACKEND.value == "triton":
        return True
    return query.is_cuda and triton_available()


def decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    return_logits: bool = False,
    scores: torch.Tensor | None = None,
    decay: float = 1.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decode_attention_torch`, or the fused Triton kernel where :func:`uses_triton` says so
    (same arguments, results equal within dtype tolerance; soft-capped logits always take the
    PyTorch path)."""
    if softcap is not None:
        return decode_attention_torch(
            query, keys, values, log_weight, scaling, return_logits, scores, decay, softcap
        )
    if uses_triton(query):
        from kernels.triton_decode import triton_decode_attention

        return triton_decode_attention(query, keys, values, log_weight, scaling, return_logits, scores, decay)
    return decode_attention_torch(query, keys, values, log_weight, scaling, return_logits, scores, decay)


def decode_attention_torch(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    log_weight: torch.Tensor | None,
    scaling: float,
    return_logits: bool = False,
    scores: torch.Tensor | None = None,
    decay: float = 1.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of new queries over the cache with an additive per-slot bias (ZSMerge Eq. 8).

    ``a = softmax(cap(q k^T * scaling) + log_weight)`` in float32, ``o = a V``, where ``cap`` is
    the identity or Gemma-2's logit soft-capping ``c * tanh(x / c)``.

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, q_len, head_dim]`` (``q_len`` is 1 at a decode step).
    keys, values : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``.
    log_weight : torch.Tensor | None
        ``[batch, kv_heads, slots]`` float32 bias, or None for none.
    scaling : float
        Softmax scale.
    return_logits : bool
        Return the unbiased logits instead of the group-mean probabilities.
    scores : torch.Tensor | None
        ``[batch, kv_heads, slots]`` float32 scores updated in place as ``decay * scores + probs``
        (ZSMerge Eq. 5; H2O's accumulation with ``decay = 1``); not with ``return_logits``.
    decay : float
        ``lambda`` of that update.
    softcap : float | None
        Logit soft-cap ``c`` (None: none); the returned logits are the capped ones.

    Returns
    -------
    out : torch.Tensor
        ``[batch, q_heads, q_len, head_dim]`` in the query's dtype.
    probs : torch.Tensor
        ``[batch, kv_heads, slots]`` float32: the probabilities averaged over the query heads of
        each group and over ``q_len``; with ``return_logits`` the float32 logits
        ``q k^T * scaling`` (no bias) ``[batch, kv_heads, group * q_len, slots]``.

    Raises
    ------
    ValueError
        For ``scores`` together with ``return_logits``.
    """
    b, hq, q_len, d = query.shape
    hkv = keys.shape[1]
    q = query.reshape(b, hkv, (hq // hkv) * q_len, d) * scaling
    logits = torch.matmul(q, keys.transpose(-1, -2)).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    biased = logits + log_weight.unsqueeze(2) if log_weight is not None else logits
    probs = torch.softmax(biased, dim=-1)
    out = torch.matmul(probs.to(values.dtype), values).view(b, hq, q_len, values.shape[-1])
    if return_logits:
        if scores is not None:
            raise ValueError("the fused score update needs probabilities, not logits")
        return out, logits
    mean = probs.mean(dim=2)
    if scores is not None:
        scores.mul_(decay).add_(mean)
    return out, mean
