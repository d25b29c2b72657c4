"""The seam's decode attention: one query per head over a layer's slots, chosen from what the
layer's rule declares (``CompressionMethod.decode_input``, ``uses_log_weight``, ``score_decay``).

- Nothing to return (``decode_input = "none"``), no ``log_weight`` bias and no logit soft-cap:
  fused SDPA.
- Otherwise explicit attention with the bias (``kernels.decode_attention``: the Triton kernel on
  CUDA, the PyTorch specification elsewhere), returning the group-mean probabilities
  (``"probs"``) or the scaled logits of every query head (``"logits"``).
- With ``"probs"`` and a ``score_decay`` ``lambda``, the score update ``s <- lambda s + a`` is
  fused into the attention: it writes the rule's ``scores`` field in place and the rule's
  ``decode_step`` receives ``probs=None``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import decode_attention as kernel_attention
from kernels.ragged_decode import ragged_decode_attention
from methods.seam.layer import CompressedLayer


def decode_attention(
    layer: CompressedLayer, query: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of one decode step over ``layer``'s slots (this step's token already appended).

    Parameters
    ----------
    layer : CompressedLayer
        The layer; ``layer.method`` is its rule.
    query : torch.Tensor
        ``[batch, q_heads, 1, head_dim]`` post-RoPE.
    scaling : float
        Softmax scale.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor | None]
        Output ``[batch, q_heads, 1, head_dim]`` and what the rule's ``decode_step`` receives:
        ``[batch, kv_heads, slots]`` float32 group-mean probabilities (with the bias) for
        ``"probs"``, ``[batch, kv_heads, group, slots]`` float32 scaled logits (without the bias)
        for ``"logits"``; None for ``"none"`` or when the score update was fused. On a layer with
        ragged heads (``layer.ragged``) the probabilities are ``[total slots]`` float32 over its
        packed buffer (``kernels.ragged_decode``); logits and fused updates are not offered there.
    """
    if layer.ragged is not None:
        return _ragged(layer, query, scaling)
    rule = layer.method
    needs = rule.decode_input
    keys, values = layer.keys, layer.values
    if needs == "none" and not rule.uses_log_weight and layer.softcap is None:
        return F.scaled_dot_product_attention(query, keys, values, scale=scaling, enable_gqa=True), None
    decay = rule.score_decay if needs == "probs" else None
    fused = None if decay is None else layer.store.view("scores")  # updated in place
    out, scores = kernel_attention(
        query,
        keys,
        values,
        layer.log_weight if rule.uses_log_weight else None,
        scaling,
        return_logits=needs == "logits",
        scores=fused,
        decay=1.0 if decay is None else decay,
        softcap=layer.softcap,
    )
    return out, None if needs == "none" or fused is not None else scores


def _ragged(
    layer: CompressedLayer, query: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Decode attention over a layer whose heads hold different slot counts (packed segments)."""
    r = layer.ragged
    b, hq, _, d = query.shape
    h = r.shape[1]
    out, probs = ragged_decode_attention(
        query.reshape(b * h, hq // h, d),
        r.buffers["keys"],
        r.buffers["values"],
        r.offsets,
        r.lengths,
        r.segment,
        r.valid(),
        None,
        scaling,
        layer.softcap,
        return_probs=layer.method.decode_input == "probs",
    )
    return out.reshape(b, hq, 1, -1), probs
