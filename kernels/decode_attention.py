"""Decode attention over a compressed cache: one query per head, per-slot log-weight bias.

:func:`decode_attention` is the specification of the decode step and the CPU path; it runs the fused
Triton kernel (``kernels.triton_decode``) instead for one-token queries where the backend asks for it
and the kernel passed its proof for these inputs (``kernels.proof``); :data:`decode_attention_torch`
never does. GQA is handled by grouping query heads onto their KV head, never by repeating KV.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from kernels.proof import CASES, Case, triton_proven, triton_wanted
from kernels.switch import BACKEND, RAN

set_backend, get_backend = BACKEND.set, BACKEND.get


def uses_triton(query: torch.Tensor) -> bool:
    """Whether the backend asks for the Triton kernel for this query (one token, ``kernels.proof``'s
    :func:`~kernels.proof.triton_wanted`), before its proof."""
    return query.shape[2] == 1 and triton_wanted(query.device)


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
    spec: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of new queries over the cache with an additive per-slot bias (ZSMerge Eq. 8).

    ``a = softmax(cap(q k^T * scaling) + log_weight)`` in float32, ``o = a V``, where ``cap`` is
    the identity or Gemma-2's logit soft-capping ``c * tanh(x / c)``. The fused Triton kernel
    computes it instead where :func:`uses_triton` says so and the kernel passed its proof for these
    inputs (results equal within dtype tolerance; soft-capped logits, and keys narrower than values,
    ThinK's, always take the PyTorch path).
    A one-token call is noted in ``kernels.switch.RAN`` under ``uniform``.

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
    spec : bool
        Run the PyTorch specification only (:data:`decode_attention_torch`): no kernel, nothing noted.

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
    kernels.proof.KernelProofError
        With ``kernels=triton``, if the kernel failed its proof.
    """
    if not spec and softcap is None and uses_triton(query) and values.shape[-1] == query.shape[-1]:
        _, hq, _, d = query.shape
        options = {"logits": return_logits, "fused": scores is not None, "bias": log_weight is not None}
        if triton_proven("uniform", query.device, query.dtype, d, hq // keys.shape[1], **options):
            from kernels import triton_decode

            RAN.note("uniform", "triton")
            return triton_decode.triton_decode_attention(
                query, keys, values, log_weight, scaling, return_logits, scores, decay
            )
    if not spec and query.shape[2] == 1:
        RAN.note("uniform", "torch")
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


def masked_sdpa(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """``softmax(q k^T * scaling) V`` over the slots ``valid`` ``[1, 1, slots]`` (bool; None: all), for
    query ``[batch, q_heads, q_len, head_dim]`` and keys, values ``[batch, kv_heads, slots, head_dim]``
    (GQA: ``q_heads`` a multiple of ``kv_heads``); returns ``[batch, q_heads, q_len, head_dim]``.

    A masked one-token step on a CPU (a growing layer's compiled step) calls ATen's CPU flash kernel
    itself, each KV head's query heads as its rows: traced, ``F.scaled_dot_product_attention`` with a
    mask lowers to the math path, which Inductor fuses with the rotary embedding and the append into
    one loop nest that ran at half the flash kernel's speed (Llama-2-7B shape, batch 8, 1K context).
    Everything else (keys narrower than values too: ThinK's) is ``F.scaled_dot_product_attention``."""
    if (
        valid is None
        or query.device.type != "cpu"
        or query.shape[2] != 1
        or values.shape[-1] != query.shape[-1]
    ):
        return F.scaled_dot_product_attention(query, keys, values, valid, scale=scaling, enable_gqa=True)
    b, hq, _, d = query.shape
    hkv = keys.shape[1]
    bias = torch.where(valid, 0.0, float("-inf")).to(query.dtype).unsqueeze(0)  # [1, 1, 1, slots]
    rows = query.reshape(b, hkv, hq // hkv, d)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out = flash(rows, keys, values, attn_mask=bias, scale=scaling)[0]
    return out.reshape(b, hq, 1, values.shape[-1])


#: :func:`decode_attention` with ``spec=True``, same arguments: the specification of the decode step,
#: the CPU path and the reference of the kernel's proof.
decode_attention_torch = partial(decode_attention, spec=True)


def _proof_case(
    device: torch.device, dtype: torch.dtype, head_dim: int, group: int, logits: bool, fused: bool, bias: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The kernel and :func:`decode_attention_torch` on one small case (``kernels.proof``): 2 KV heads
    of 83 slots (a full kernel block and a partial one) viewed in a wider buffer, as the cache's are."""
    from kernels import triton_decode  # looked up per proof: a test may swap the kernel

    g = torch.Generator().manual_seed(0)
    slots, hkv = 83, 2
    query = torch.randn(1, hkv * group, 1, head_dim, generator=g).to(device, dtype)
    keys, values = torch.randn(2, 1, hkv, slots + 5, head_dim, generator=g).to(device, dtype)[..., :slots, :]
    log_weight = (torch.rand(1, hkv, slots, generator=g) * 2).log().to(device) if bias else None
    scores = torch.rand(1, hkv, slots, generator=g).to(device) if fused else None
    results = []
    for attend in (triton_decode.triton_decode_attention, decode_attention_torch):
        updated = None if scores is None else scores.clone()
        out, aux = attend(query, keys, values, log_weight, head_dim**-0.5, logits, updated, 0.9)
        results.append([out, aux] + ([updated] if fused else []))
    return list(zip(*results, strict=True))


#: Every option set :func:`decode_attention` may pass to the kernel (logits exclude the fused update).
CASES["uniform"] = Case(
    _proof_case,
    tuple(
        {"logits": logits, "fused": fused, "bias": bias}
        for logits in (False, True)
        for fused in (False, True)
        for bias in (False, True)
        if not (logits and fused)
    ),
)
