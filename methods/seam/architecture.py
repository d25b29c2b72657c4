"""What a model's architecture asks of the cache, read from its transformers config.

Per decoder layer (:class:`LayerSpec`): full or sliding-window attention (and the window), the
attention-logit soft-cap, and the rotary embedding of that layer's type. The layer types are
read the way transformers builds the model's own ``DynamicCache``
(``cache_utils.get_layer_types_and_kwargs``: ``layer_types``, else ``sliding_window`` /
``use_sliding_window`` / the interleaving pattern the config class derived), so a layer is
sliding here exactly when the model's own cache keeps a window for it.

:func:`check_supported` refuses, from the config alone (before any weights load), the
architectures whose state is not a per-layer key/value cache this seam can hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from methods.seam.rope import LayerRotary

FULL, SLIDING = "full_attention", "sliding_attention"


class UnsupportedArchitectureError(ValueError):
    """A model feature the cache seam does not support (the message names it)."""


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer as the cache sees it.

    Attributes
    ----------
    layer_type : str
        ``"full_attention"`` or ``"sliding_attention"``.
    window : int | None
        Sliding window in tokens: a query attends to itself and the ``window - 1`` tokens
        before it (transformers' ``sliding_window_overlay``: ``kv > q - window``); None for full
        attention.
    softcap : float | None
        Attention-logit soft-cap ``c`` (Gemma-2: logits ``c * tanh(logits / c)`` before the
        softmax), or None.
    rotary : LayerRotary | None
        The rotary embedding of this layer's type (None for a model without RoPE).
    out_proj : torch.Tensor | None
        The attention's output projection ``o_proj.weight`` ``[hidden, q_heads * head_dim]`` (the
        model's own parameter, detached: no copy), for methods that weigh values by what the layer
        outputs (CriticalKV); None when the attention module has no ``o_proj``.
    layer_idx, num_layers : int
        This layer's index and the model's number of decoder layers (per-layer budget schedules).
    """

    layer_type: str = FULL
    window: int | None = None
    softcap: float | None = None
    rotary: LayerRotary | None = None
    out_proj: torch.Tensor | None = field(default=None, compare=False, repr=False)
    layer_idx: int = 0
    num_layers: int = 1


def text_config(config):
    """The decoder's config (``config.get_text_config(decoder=True)`` for multimodal wrappers)."""
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config


def layer_types(config) -> tuple[list[str], list[int | None]]:
    """Per layer, its type and sliding window (None unless sliding), as transformers' own cache
    would build it.

    Raises
    ------
    UnsupportedArchitectureError
        For a layer type other than full or sliding-window attention (chunked attention,
        recurrent/linear-attention/convolution layers, shared or compressed KV).
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = text_config(config)
    types, kwargs = get_layer_types_and_kwargs(config)
    windows: list[int | None] = []
    for i, (kind, extra) in enumerate(zip(types, kwargs, strict=True)):
        if kind == FULL:
            windows.append(None)
        elif kind == SLIDING and extra.get("sliding_window"):
            windows.append(int(extra["sliding_window"]))
        else:
            raise UnsupportedArchitectureError(
                f"layer {i} is a {kind!r} layer; KVBench supports full and sliding-window "
                "attention layers only"
            )
    return list(types), windows


def check_supported(config) -> None:
    """Refuse architectures the cache seam cannot hold, from the config alone.

    Raises
    ------
    UnsupportedArchitectureError
        For an encoder-decoder or cross-attention model, latent (MLA) key/value caches,
        unsupported layer types (:func:`layer_types`), or a model class without pluggable
        attention (transformers' ``_supports_attention_backend``).
    """
    text = text_config(config)
    name = getattr(config, "model_type", type(config).__name__)
    if getattr(config, "is_encoder_decoder", False) or getattr(text, "add_cross_attention", False):
        raise UnsupportedArchitectureError(
            f"{name}: cross-attention (encoder-decoder) models are not supported"
        )
    if getattr(text, "cross_attention_layers", None):
        raise UnsupportedArchitectureError(f"{name}: cross-attention layers are not supported")
    if getattr(text, "kv_lora_rank", None):
        raise UnsupportedArchitectureError(f"{name}: latent (MLA) key/value caches are not supported")
    layer_types(config)
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if model_class is not None and not getattr(model_class, "_supports_attention_backend", False):
        raise UnsupportedArchitectureError(
            f"{name}: {model_class.__name__} does not take a pluggable attention function "
            "(transformers' AttentionInterface), which KVBench's cache seam needs"
        )


def layer_specs(model: torch.nn.Module) -> list[LayerSpec]:
    """The :class:`LayerSpec` of every decoder layer of a loaded model.

    Raises
    ------
    UnsupportedArchitectureError
        As :func:`layer_types`.
    """
    config = text_config(model.config)
    types, windows = layer_types(config)
    softcap = getattr(config, "attn_logit_softcapping", None)
    rotary_emb = getattr(model.base_model, "rotary_emb", None)
    per_type = rotary_emb is not None and LayerRotary.takes_layer_type(rotary_emb)
    rotaries: dict[str | None, LayerRotary] = {}
    specs = []
    for kind, window, out_proj in zip(types, windows, output_projections(model, len(types)), strict=True):
        rotary = None
        if rotary_emb is not None:
            key = kind if per_type else None
            rotary = rotaries.setdefault(key, LayerRotary(rotary_emb, key))
        specs.append(LayerSpec(kind, window, float(softcap) if softcap else None, rotary, out_proj))
    return specs


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module | None]:
    """Per decoder layer (``model.get_decoder().layers``), its attention module ``self_attn`` (None where
    a layer has none); an empty list when the decoder's layers cannot be found."""
    get_decoder = getattr(model, "get_decoder", None)
    layers = getattr(get_decoder() if get_decoder is not None else None, "layers", None)
    return [getattr(layer, "self_attn", None) for layer in (layers if layers is not None else [])]


def output_projections(model: torch.nn.Module, n_layers: int) -> list[torch.Tensor | None]:
    """Per decoder layer, its attention's ``o_proj.weight`` ``[hidden, q_heads * head_dim]``,
    detached (a view of the parameter, no copy); None for every layer when the decoder's layers
    or their ``self_attn.o_proj`` cannot be found (:func:`attention_modules`)."""
    weights = [
        getattr(getattr(module, "o_proj", None), "weight", None) for module in attention_modules(model)
    ]
    if len(weights) != n_layers or any(w is None for w in weights):
        return [None] * n_layers
    return [w.detach() for w in weights]
