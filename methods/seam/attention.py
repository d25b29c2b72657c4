"""The attention function registered with ``transformers.AttentionInterface`` as ``"kvbench"``.

Models are loaded with ``attn_implementation="kvbench"``; transformers then builds no mask for
them, and this function owns causality. The :class:`~methods.seam.cache.CompressedCache` arrives as the
``kvbench_cache`` keyword that our generation loop passes to the model's forward.

- Prefill (the layer is empty before this call): output over the whole prompt (every official
  code path computes prefill output uncompressed) by fused causal SDPA, or on a sliding-window
  layer / with logit soft-capping by :func:`prefill_attention`'s chunked path; then the layer's
  rule (the method, or ``methods.seam.sliding`` on a sliding layer) scores and compresses the layer.
- Chunk (several tokens on a prefilled layer: a question appended after the context was compressed):
  one decode step per token (``methods.seam.step.layer_step``).
- Rows: a cache that batches the decode steps of several prompts' caches (``runners.generation.rows``) attends
  each layer its own way (``attend(layer_idx, ...)``, the one call this function makes).
- Decode step: explicit attention over the slots with the ``log_weight`` bias
  (``kernels.decode_attention``), whose probabilities the method uses to update its scores
  before evicting/merging (ZSMerge Algorithm 1 order). Methods that need no probabilities get
  fused SDPA.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from kernels.prefill import prefill_attention
from methods.seam.cache import CompressedCache

__all__ = ["ATTN_IMPLEMENTATION", "kvbench_attention", "prefill_attention"]

ATTN_IMPLEMENTATION = "kvbench"


def kvbench_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
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
        ``[batch, kv_heads, q_len, head_dim]``: this call's tokens (``CompressedLayer.update``
        returns them; the attention reads the layer's store).
    attention_mask : torch.Tensor | None
        Must be None (padding is not supported by this function yet).
    scaling : float | None
        Softmax scale; ``head_dim ** -0.5`` if None (Gemma passes ``query_pre_attn_scalar ** -0.5``).
    softcap, sliding_window : float | None, int | None
        What the model's attention module passes; they must agree with the layer's
        :class:`~methods.seam.architecture.LayerSpec`, which the cache read from the config.
    kvbench_cache : CompressedCache
        The cache the model was called with (or a ``runners.generation.rows.RowsCache``: one prefilled cache
        per batch row, decode steps only); its ``attend`` runs the layer's step.
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
    RuntimeError
        If the module's ``softcap`` / ``sliding_window`` differ from what the cache was built
        for (the config and the modelling code disagree).
    """
    if kvbench_cache is None:
        raise ValueError("the 'kvbench' attention needs kvbench_cache=<CompressedCache> in the forward call")
    if attention_mask is not None:
        raise ValueError("the 'kvbench' attention takes no attention mask (it owns causality)")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    idx = module.layer_idx
    _check_layer(idx, kvbench_cache.layers[idx].spec, softcap, sliding_window)
    out = kvbench_cache.attend(idx, query, key, value, scale)
    if kvbench_observer is not None:
        q_len = query.shape[2]
        kvbench_observer(module.layer_idx, query, key[:, :, -q_len:], value[:, :, -q_len:], out, scale)
    return out.transpose(1, 2).contiguous(), None


def _check_layer(idx: int, spec, softcap: float | None, sliding_window: int | None) -> None:
    if (softcap or None) != spec.softcap or (sliding_window or None) != spec.window:
        raise RuntimeError(
            f"layer {idx}: the model attends with softcap={softcap}, sliding_window={sliding_window}, "
            f"but its config gave softcap={spec.softcap}, window={spec.window}"
        )


AttentionInterface.register(ATTN_IMPLEMENTATION, kvbench_attention)
