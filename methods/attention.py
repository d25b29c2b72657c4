"""The attention function registered with ``transformers.AttentionInterface`` as ``"kvbench"``.

Models are loaded with ``attn_implementation="kvbench"``; transformers then builds no mask for
them, and this function owns causality. The :class:`~methods.cache.CompressedCache` arrives as the
``kvbench_cache`` keyword that our generation loop passes to the model's forward.

- Prefill (the layer is empty before this call): output by fused SDPA over the whole prompt
  (every official code path computes prefill output uncompressed), then the method scores and
  compresses the layer.
- Decode step: explicit attention over the slots with the ``log_weight`` bias
  (``kernels.decode_attention``), whose probabilities the method uses to update its scores
  before evicting/merging (ZSMerge Algorithm 1 order). Methods that need no probabilities get
  fused SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from methods.cache import CompressedCache

ATTN_IMPLEMENTATION = "kvbench"


def kvbench_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    kvbench_cache: CompressedCache | None = None,
    kvbench_observer=None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over the compressed cache of ``module.layer_idx``.

    Parameters
    ----------
    module : torch.nn.Module
        The attention module (gives ``layer_idx``).
    query : torch.Tensor
        ``[batch, q_heads, q_len, head_dim]`` post-RoPE.
    key, value : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``: the layer's slots after appending this call's tokens.
    attention_mask : torch.Tensor | None
        Must be None (padding is not supported by this function yet).
    scaling : float | None
        Softmax scale; ``head_dim ** -0.5`` if None.
    kvbench_cache : CompressedCache
        The cache the model was called with.
    kvbench_observer : callable, optional
        Called as ``observer(layer_idx, query, new_keys, new_values, out, scale)`` after each layer's
        attention, with this call's keys/values ``[batch, kv_heads, q_len, head_dim]`` and the output
        ``[batch, q_heads, q_len, head_dim]`` (the error runner drives shadow caches with it).

    Returns
    -------
    tuple[torch.Tensor, None]
        Output ``[batch, q_len, q_heads, head_dim]`` and no weights.

    Raises
    ------
    ValueError
        If no ``kvbench_cache`` was passed or an attention mask was given.
    NotImplementedError
        For a multi-token forward on an already filled layer (chunked prefill).
    """
    if kvbench_cache is None:
        raise ValueError("the 'kvbench' attention needs kvbench_cache=<CompressedCache> in the forward call")
    if attention_mask is not None:
        raise ValueError("the 'kvbench' attention takes no attention mask (it owns causality)")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    layer = kvbench_cache.layers[module.layer_idx]
    method = kvbench_cache.method
    if not layer.prefilled:
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=query.shape[2] > 1, scale=scale, enable_gqa=True
        )
        method.prefill(layer, query, scale)
        layer.prefilled = True
    elif query.shape[2] == 1:
        out, probs = method.decode_attention(layer, query, value, scale)
        method.decode_step(layer, probs)
    else:
        raise NotImplementedError("chunked prefill on a filled compressed cache is not supported")
    if kvbench_observer is not None:
        q_len = query.shape[2]
        kvbench_observer(module.layer_idx, query, key[:, :, -q_len:], value[:, :, -q_len:], out, scale)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPLEMENTATION, kvbench_attention)
