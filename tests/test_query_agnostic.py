"""The question after compression (``task.query_aware=false``): a chunk appended to a compressed
cache attends to the kept slots and to itself causally, at continuing positions, and every method's
rule then runs as in decoding (``methods.seam.step.layer_step``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from methods import FullKV
from runners.generation.greedy import ModelRun, eos_token_ids, greedy_generate
from tests.generate_reference import hf_greedy
from tests.method_settings import build_preset

CONTEXT, QUESTION, BUDGET = 48, 9, 16


def ids(seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 128, (1, CONTEXT + QUESTION), generator=torch.Generator().manual_seed(seed))


def held(run: ModelRun) -> list[tuple[int, list[int]]]:
    """Per layer: the slot count and the sorted token positions the cache holds."""
    out = []
    for layer in run.cache.layers:
        pos = layer.store.positions  # -1 on the padding of ragged heads
        out.append((layer.store.n_slots, sorted(p for p in pos.flatten().tolist() if p >= 0)))
    return out


@torch.inference_mode()
def test_fullkv_chunk_after_prefill_equals_one_prefill(tiny_model):
    prompt = ids()
    whole = ModelRun(tiny_model, FullKV(), None, prompt.shape[1]).prefill(prompt)
    run = ModelRun(tiny_model, FullKV(), None, prompt.shape[1])
    run.prefill(prompt[:, :CONTEXT])
    torch.testing.assert_close(run.append(prompt[:, CONTEXT:]), whole, atol=1e-4, rtol=1e-4)
    assert run.cache.layers[0].get_seq_length() == prompt.shape[1]
    tokens = greedy_generate(
        tiny_model, prompt, FullKV(), None, 12, eos_token_ids(tiny_model), question_start=CONTEXT
    ).tokens
    assert tokens == hf_greedy(tiny_model, prompt, 12) and len(set(tokens)) > 2


@pytest.mark.parametrize("preset", ["snapkv", "h2o", "streamingllm", "tova", "zsmerge", "adakv_snapkv"])
@torch.inference_mode()
def test_chunk_equals_the_same_tokens_as_decode_steps(tiny_model, preset):
    """One forward of the chunk gives the logits and the kept slots of feeding its tokens one decode
    step at a time; a prompt-only method keeps the whole chunk, a decoding-time one stays in budget."""
    prompt = ids()
    chunked = ModelRun(tiny_model, build_preset(preset), BUDGET, prompt.shape[1])
    chunked.prefill(prompt[:, :CONTEXT])
    logits = chunked.append(prompt[:, CONTEXT:])
    stepped = ModelRun(tiny_model, build_preset(preset), BUDGET, prompt.shape[1])
    stepped.prefill(prompt[:, :CONTEXT])
    for token in prompt[0, CONTEXT:]:
        last = stepped.step(token[None])
    torch.testing.assert_close(logits, last, atol=1e-4, rtol=1e-4)
    assert held(chunked) == held(stepped)
    layer = chunked.cache.layers[0]
    if chunked.cache.rules[0].traits.holds_in_decode:
        assert layer.store.n_slots <= layer.plan.bound
    else:  # the prompt-only methods keep every question token
        assert set(range(CONTEXT, CONTEXT + QUESTION)) <= set(held(chunked)[0][1])
        assert min(n for n, _ in held(chunked)) < CONTEXT  # and the context was compressed


@pytest.mark.parametrize(
    "preset", ["tova", "knorm", "keydiff", "expected_attention", "streamingllm", "lagkv", "random", "h2o"]
)
@torch.inference_mode()
def test_decode_budget_false_compresses_the_context_only(tiny_model, preset):
    """kvpress's presses: the context is compressed to the budget, then the question is kept whole."""
    prompt = ids()
    method = dataclasses.replace(build_preset(preset), decode_budget=False)
    run = ModelRun(tiny_model, method, BUDGET, prompt.shape[1])
    run.prefill(prompt[:, :CONTEXT])
    kept = [layer.store.n_slots for layer in run.cache.layers]
    run.append(prompt[:, CONTEXT:])
    assert all(k <= BUDGET for k in kept)
    assert [n for n, _ in held(run)] == [k + QUESTION for k in kept]
    assert all(set(range(CONTEXT, CONTEXT + QUESTION)) <= set(pos) for _, pos in held(run))


def test_the_realised_compression_is_of_the_context(tiny_model):
    """Query-agnostic: the slots right after the prefill and the tokens it compressed are the
    context's, before the question is appended."""
    res = greedy_generate(tiny_model, ids(), build_preset("snapkv"), BUDGET, 3, set(), question_start=CONTEXT)
    assert res.prefill_tokens == CONTEXT and res.prefill_slots == [BUDGET, BUDGET]
    assert res.slots == [BUDGET + QUESTION + 2] * 2  # the question and two new tokens are appended after
