"""Probe forwards after a prefill (``methods.probing``: KVzip's context reconstruction).

A probing method asks for forwards of its own token chunks (:meth:`Probing.probe_prompts`)
once the prompt is prefilled and before anything is compressed. :class:`ProbeCache` is the cache
those forwards run with: each layer's chunk attends to the layer's prefilled slots and to its own
earlier tokens (causal, at the positions that follow the prompt; :func:`probe_attention`), the
layer's rule reads the chunk (:meth:`Probing.probe`), and nothing is appended, so every
chunk sees the prompt's cache as the prefill left it. ``runners.generation.model_run.probe_caches`` runs the
forwards, then the method compresses its layers (:meth:`Probing.compress`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, CacheLayerMixin

from kernels.prefill import group_queries, grouped_logits
from methods.probing import Probe
from methods.seam.architecture import attention_modules
from methods.seam.cache import CompressedCache
from methods.seam.layer import CompressedLayer


def probe_attention(
    layer: CompressedLayer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    block: int = 1024,
) -> torch.Tensor:
    """Attention of a chunk over a layer's slots and over itself, the layer left unchanged.

    Query ``i`` (at position ``seen + i``, ``seen = layer.get_seq_length()``) attends to every slot
    (with its ``log_weight`` bias) and to the chunk's tokens ``j <= i``; on a sliding-window layer
    only to keys within the window; logits are soft-capped as the layer's spec says. This is what the
    model computes for the chunk with the prompt in its cache (the cache's own prefill output plus
    a causal chunk), in float32, ``block`` queries at a time (fused SDPA without soft-capping).

    Parameters
    ----------
    layer : CompressedLayer
        A prefilled layer.
    query : torch.Tensor
        ``[batch, q_heads, chunk, head_dim]`` post-RoPE.
    key, value : torch.Tensor
        ``[batch, kv_heads, chunk, head_dim]``: the chunk's keys (post-RoPE) and values.
    scaling : float
        Softmax scale.
    block : int
        Queries per block (memory ``O(block x (slots + chunk))`` per head).

    Returns
    -------
    torch.Tensor
        ``[batch, q_heads, chunk, head_dim]`` in the query's dtype.
    """
    store, spec = layer.store, layer.spec
    b, hkv, n = key.shape[:3]
    keys = torch.cat([store.keys, key], dim=2).float()
    values = torch.cat([store.values, value], dim=2).float()
    q_pos = torch.arange(layer.get_seq_length(), layer.get_seq_length() + n, device=key.device)
    k_pos = torch.cat([store.positions, q_pos.expand(b, hkv, n)], dim=2)[:, :, None]  # [b, hkv, 1, keys]
    bias = torch.cat([store.log_weight, key.new_zeros((b, hkv, n), dtype=torch.float32)], dim=2)[:, :, None]
    if torch.equal(k_pos, k_pos[:, :1].expand_as(k_pos)) and torch.equal(bias, bias[:, :1].expand_as(bias)):
        k_pos, bias = k_pos[:, :1], bias[:, :1]  # every head holds the same slots: one mask for all heads
    out = torch.empty_like(query)
    for start in range(0, n, block):
        stop = min(start + block, n)
        rows = q_pos[start:stop, None]
        allowed = k_pos <= rows  # [batch, kv_heads or 1, block, keys]
        if spec.window is not None:
            allowed &= k_pos > rows - spec.window
        q, mask = group_queries(query[:, :, start:stop], hkv).float(), bias.masked_fill(~allowed, -torch.inf)
        if spec.softcap is None:  # fused (the mask's group axis broadcast to the query heads)
            if mask.shape[1] > 1:
                mask = mask[:, :, None].expand(*q.shape[:-1], keys.shape[2]).flatten(1, 2)
            chunk = F.scaled_dot_product_attention(
                q.flatten(1, 2), keys, values, attn_mask=mask, scale=scaling, enable_gqa=True
            )
        else:
            logits = grouped_logits(q, keys, scaling, spec.softcap)
            chunk = torch.einsum("bhgqk,bhkd->bhgqd", (logits + mask[:, :, None]).softmax(dim=-1), values)
        out[:, :, start:stop] = chunk.reshape(b, -1, stop - start, values.shape[-1]).to(query.dtype)
    return out


class ProbeLayer(CacheLayerMixin):
    """One decoder layer of a :class:`ProbeCache`: the prefilled layer, never appended to."""

    def __init__(self, layer: CompressedLayer) -> None:
        self.layer, self.spec = layer, layer.spec
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the chunk's keys/values ``[batch, kv_heads, chunk, head_dim]`` unappended."""
        return key_states, value_states

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate."""

    def get_seq_length(self) -> int:
        """The prompt's tokens (the chunk follows them)."""
        return self.layer.get_seq_length()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Mask sizes for transformers' mask builders (the ``kvbench`` attention takes no mask)."""
        return self.layer.store.n_slots + query_length, 0

    def get_max_length(self) -> int:
        """-1: no fixed maximum."""
        return -1


class ProbeCache(Cache):
    """The cache of a probe forward over a prefilled :class:`CompressedCache` (module docstring).

    Parameters
    ----------
    caches : CompressedCache | list[CompressedCache]
        Prefilled, not yet compressed by their probing methods; several (a grid's settings whose
        probes are the same forwards) hold the same prompt in the same storage kind: the first one's
        layers give the attention, every cache's probing rules read each chunk.

    Attributes
    ----------
    probe : Probe | None
        The chunk being fed (set before each forward), handed to the rules that probe.
    """

    def __init__(self, caches: CompressedCache | list[CompressedCache]) -> None:
        self.caches = [caches] if isinstance(caches, CompressedCache) else list(caches)
        self.cache = self.caches[0]
        super().__init__(layers=[ProbeLayer(layer) for layer in self.cache.layers])
        self.probe: Probe | None = None
        self.hidden_norms: dict[int, torch.Tensor] = {}  # by layer: the chunk's attention-input norms

    @contextlib.contextmanager
    def hooked(self, model: torch.nn.Module) -> Iterator[ProbeCache]:
        """Within the block, each decoder layer's attention module records the L2 norm ``[batch,
        tokens]`` of its input hidden states into :attr:`hidden_norms` (KVzip+'s row normalisation);
        nothing is recorded where the attention module cannot be found
        (``methods.seam.architecture.attention_modules``)."""
        hooks = [
            attention.register_forward_pre_hook(self._norm_hook(i), with_kwargs=True)
            for i, attention in enumerate(attention_modules(model))
            if attention is not None
        ]
        try:
            yield self
        finally:
            for hook in hooks:
                hook.remove()

    def _norm_hook(self, layer_idx: int):
        def hook(module, args, kwargs):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if hidden is not None:
                self.hidden_norms[layer_idx] = torch.linalg.vector_norm(hidden, dim=-1, dtype=torch.float32)

        return hook

    def attend(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """The attention function's call on layer ``layer_idx``: :func:`probe_attention` over the first
        cache's layer, then each cache's rule of that layer reads the chunk if it probes; output
        ``[batch, q_heads, chunk, head_dim]``."""
        out = probe_attention(self.cache.layers[layer_idx], query, key, value, scaling)
        norm = self.hidden_norms.pop(layer_idx, None)
        for cache in self.caches:
            if (rule := cache.rules[layer_idx]).traits.probes:
                rule.probe(cache.layers[layer_idx], query, key, scaling, self.probe, norm)
        return out
