"""Teacher activations for LESS training, streamed one forward pass at a time.

A full-attention forward of the frozen model records, per decoder layer, the post-RoPE queries,
keys and values the attention function receives and the attention block's output after
``o_proj`` (docs/methods.md, "LESS"). Nothing is stored beyond one batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

CAPTURE_IMPLEMENTATION = "kvbench_capture"


@dataclass
class LayerActivations:
    """One layer's teacher activations for a batch of windows.

    Attributes
    ----------
    query : torch.Tensor
        ``[batch, q_heads, length, head_dim]`` post-RoPE.
    keys, values : torch.Tensor
        ``[batch, kv_heads, length, head_dim]`` (keys post-RoPE).
    output : torch.Tensor
        ``[batch, length, hidden]``: the attention block's output after ``o_proj``.
    scaling : float
        The layer's softmax scale.
    """

    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    output: torch.Tensor
    scaling: float


def _capture_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA attention that also records its inputs in ``kwargs["less_capture"][layer_idx]``."""
    store = kwargs.pop("less_capture")
    store[module.layer_idx] = {"query": query, "keys": key, "values": value, "scaling": scaling}
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )


AttentionInterface.register(CAPTURE_IMPLEMENTATION, _capture_attention)


@torch.no_grad()
def stream_activations(
    model: torch.nn.Module,
    windows: torch.Tensor,
    layers: list[int],
    batch_size: int = 1,
    order: torch.Tensor | None = None,
) -> Iterator[tuple[tuple[int, ...], dict[int, LayerActivations]]]:
    """Yield ``(window indices, {layer: LayerActivations})`` per batch of ``windows`` ``[n, length]``
    (token ids), visiting windows in ``order`` (default: as given).

    The model is switched to full SDPA attention for the duration and switched back afterwards.
    """
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE_IMPLEMENTATION)
    outputs: dict[int, torch.Tensor] = {}
    hooks = [
        model.model.layers[i].self_attn.register_forward_hook(
            lambda _m, _a, out, i=i: outputs.__setitem__(i, out[0].detach())
        )
        for i in layers
    ]
    try:
        order = torch.arange(windows.shape[0]) if order is None else order
        for start in range(0, windows.shape[0], batch_size):
            store: dict[int, dict] = {}
            index = order[start : start + batch_size]
            model.model(input_ids=windows[index], use_cache=False, less_capture=store)
            yield tuple(index.tolist()), {i: LayerActivations(output=outputs[i], **store[i]) for i in layers}
    finally:
        for hook in hooks:
            hook.remove()
        model.set_attn_implementation(previous)
