"""Tiny random-weight models of every supported family, built from transformers config classes (no
download, a second each): the architecture matrix of tests/test_architectures.py.

Each family keeps what makes it different: Mistral's sliding window on every layer (smaller than
the test prompt), Qwen2's GQA, Qwen3's QK-norm, Gemma-2's logit soft-capping + interleaved
sliding layers + ``query_pre_attn_scalar`` scaling, Gemma-3's interleaved sliding layers with
local/global RoPE and MQA, Phi-3's fused projections with a sliding window; head_dim differs from
hidden / heads where the family allows it, and embeddings are tied where the family ties them.
"""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

WINDOW = 16  # sliding window of the sliding families; test prompts are longer
VOCAB = 128
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "max_position_embeddings": 512,
    "eos_token_id": 2,
    "bos_token_id": 1,
    "pad_token_id": 0,
}


def _configs() -> dict[str, object]:
    return {
        "llama": LlamaConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2),
        "mistral": MistralConfig(
            **COMMON, num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW
        ),
        "qwen2": Qwen2Config(
            **COMMON, num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True
        ),
        "qwen3": Qwen3Config(**COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=24),
        "gemma2": Gemma2Config(
            **COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=32,
        ),
        "gemma3": Gemma3TextConfig(
            **COMMON,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=32,
        ),
        "phi3": Phi3Config(
            **COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=WINDOW,
            tie_word_embeddings=False,
        ),
    }


FAMILIES = tuple(_configs())


def tiny_config(name: str, attn_implementation: str = "kvbench", **overrides):
    """The config of family ``name``'s tiny model; ``overrides`` set its fields (``vocab_size`` ...)."""
    config = _configs()[name]
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = attn_implementation
    return config


def tiny_family(
    name: str, attn_implementation: str = "kvbench", seed: int = 0, **overrides
) -> torch.nn.Module:
    """The tiny model of family ``name`` (fp32, eval), with weights scaled so greedy logits are peaked
    (random init is nearly uniform); the same ``seed`` gives the same weights for every
    ``attn_implementation``; ``overrides`` set config fields (:func:`tiny_config`)."""
    config = tiny_config(name, attn_implementation, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" not in pname:
                p.mul_(3.0)
    return model
