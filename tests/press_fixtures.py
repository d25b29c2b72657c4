"""One layer of tiny random tensors for the presses' tests (2 KV heads, 3 query heads each, head_dim
8): prefilled by a method, read back as the positions each head keeps, beside the plain references
(causal attention, Llama's RoPE) that the tests compare with."""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, rotate_half

from methods.seam.architecture import LayerSpec
from methods.seam.layer import CompressedLayer
from methods.seam.rope import LayerRotary
from methods.seam.step import prefill_step

HKV, GROUP, D = 2, 3, 8


def tensors(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(keys, values, query)``: ``[1, HKV, n, D]`` twice and ``[1, HKV * GROUP, n, D]``."""
    gen = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(1, HKV, n, D, generator=gen), torch.randn(1, HKV, n, D, generator=gen)
    return keys, values, 2 * torch.randn(1, HKV * GROUP, n, D, generator=gen)


def prefilled(method, keys, values, query, budget: int | None, spec: LayerSpec | None = None):
    """A layer holding ``keys``, ``values`` after ``method``'s prefill under ``budget``."""
    layer = CompressedLayer(method.traits.state_fill, budget, spec)
    layer.update(keys, values)
    prefill_step(method, layer, query, None, None, D**-0.5)
    return layer


def kept(layer) -> list[list[int]]:
    """Per KV head, the sorted positions held (ragged padding, position -1, left out)."""
    return [sorted(p for p in layer.store.positions[0, h].tolist() if p >= 0) for h in range(HKV)]


def attention(keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention ``[q_heads, n, n]`` of every query over every key."""
    n = keys.shape[2]
    logits = torch.einsum("hqd,hkd->hqk", query[0], keys[0].repeat_interleave(GROUP, 0)) * D**-0.5
    return torch.softmax(logits.masked_fill(torch.ones(n, n).triu(1).bool(), -torch.inf), -1)


def rope(x: torch.Tensor, positions: torch.Tensor, rotary: LlamaRotaryEmbedding) -> torch.Tensor:
    """Llama's RoPE of ``x`` ``[..., n, D]`` at ``positions`` ``[n]``."""
    cos, sin = rotary(x, positions[None])
    return x * cos[0] + rotate_half(x) * sin[0]


def rotary_spec() -> tuple[LayerSpec, LlamaRotaryEmbedding]:
    config = LlamaConfig(hidden_size=D * HKV * GROUP, num_attention_heads=HKV * GROUP, head_dim=D)
    emb = LlamaRotaryEmbedding(config)
    return LayerSpec(rotary=LayerRotary(emb), layer_idx=1), emb
