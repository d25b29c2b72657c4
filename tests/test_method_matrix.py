"""One shared matrix: every method x a mild and a harsh setting, checked against invariants
on a tiny random GQA Llama (budget never exceeded, bytes match slots, a covering budget gives
FullKV's output, determinism)."""

from __future__ import annotations

import pytest
import torch

from methods import METHOD_REGISTRY, FullKV
from runners.generation.greedy import greedy_generate
from tests.method_settings import (
    CASES,
    NEW,
    PROMPT,
    SETTINGS,
    build_preset,
    preset_names,
    prompt,
)


def test_every_registered_method_is_in_the_matrix():
    assert set(SETTINGS) == set(METHOD_REGISTRY)


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_budget_and_memory_at_every_step(tiny_model, name, kwargs, budget):
    method = METHOD_REGISTRY[name](**kwargs)
    steps = []

    pooled = getattr(method, "layerwise", True) is False  # KVzip: one budget over every layer and head

    def check(cache) -> None:
        steps.append(cache.n_slots)
        held, allowed = [], []
        for layer in cache.layers:  # the layer's own budget (layer allocators), mean over its heads
            allowed.append(PROMPT + len(steps) - 1)
            if method.traits.budget_applies:
                allowed[-1] = layer.budget + (0 if method.traits.holds_in_decode else len(steps) - 1)
            held.append(layer.store.head_slots().float().mean())
            assert held[-1] <= allowed[-1] or pooled
        assert sum(held) <= sum(allowed)
        state = sum(t.nbytes for layer in cache.layers for t in layer.aux.values())  # LESS's H, z
        held = sum(  # over every head, at the held widths (ThinK's keys: their kept channels)
            int(layer.store.head_slots().sum()) * (layer.keys.shape[-1] + layer.values.shape[-1]) * 4
            for layer in cache.layers
        )
        assert cache.kv_bytes() == held + state

    res = greedy_generate(
        tiny_model, prompt(0), method, budget if method.traits.compresses else None, NEW, set(), check
    )
    assert len(steps) == NEW
    if method.traits.compresses:
        assert res.kv_bytes < res.fullkv_bytes  # memory was really released


PROMPT_ONLY = [
    pytest.param(name, kwargs, id=name)
    for name, (kwargs, _) in SETTINGS.items()
    if METHOD_REGISTRY[name](**kwargs).traits.holds_in_decode
]


@pytest.mark.parametrize(("name", "kwargs"), PROMPT_ONLY)
def test_prompt_only_rule_compresses_the_prompt_once_and_keeps_every_decoded_token(tiny_model, name, kwargs):
    """``decode_budget=false`` on every method with a decode-time rule: the prompt is compressed to
    the budget (the layer's own budget for layer allocators), then every decoded token is kept."""
    method = METHOD_REGISTRY[name](**kwargs, decode_budget=False)
    assert method.traits.prompt_only and not method.traits.holds_in_decode
    held: list[list[float]] = []

    def check(cache) -> None:
        held.append([float(layer.store.head_slots().float().mean()) for layer in cache.layers])
        for layer in cache.layers:
            assert held[0][cache.layers.index(layer)] <= layer.budget

    greedy_generate(tiny_model, prompt(0), method, 10, NEW, set(), check)
    for step, slots in enumerate(held):
        assert slots == [s + step for s in held[0]], f"step {step}: a decoded token was evicted"


@pytest.fixture(scope="module")
def fullkv_tokens(tiny_model) -> list[int]:
    """FullKV's greedy tokens on ``prompt(1)``: what every method must give at a covering budget."""
    return greedy_generate(tiny_model, prompt(1), FullKV(), None, NEW, set()).tokens


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_covering_budget_gives_fullkv_output(tiny_model, fullkv_tokens, name, kwargs, budget):
    method = METHOD_REGISTRY[name](**kwargs)
    if not method.traits.budget_applies:
        pytest.skip("the budget does not drive it (DuoAttention: tests/test_allocators.py, sparsity 0)")
    if getattr(method, "key_channel_compression_ratio", 0):
        pytest.skip("ThinK prunes key channels at any token budget (tests/test_think.py)")
    covering = PROMPT + NEW if method.traits.holds_in_decode else PROMPT
    ratios = kwargs.get("ratios")
    if ratios:  # every layer's share must cover the prompt
        covering = -(-covering * sum(ratios) // (len(ratios) * min(ratios)))
    out = greedy_generate(tiny_model, prompt(1), METHOD_REGISTRY[name](**kwargs), covering, NEW, set()).tokens
    assert out == fullkv_tokens


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_same_input_same_output(tiny_model, name, kwargs, budget):
    runs = [
        greedy_generate(tiny_model, prompt(2), METHOD_REGISTRY[name](**kwargs), budget, NEW, set())
        for _ in "ab"
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].slots == runs[1].slots


def slot_bytes(layer) -> int:
    """Bytes one slot occupies in every per-slot tensor of the layer (K, V, log-weight, positions, state)."""
    return sum(t.element_size() * t[:, :, :1].numel() for t in layer.store.buffers.values())


@pytest.mark.parametrize("budget", [10, 40, 4096])
@pytest.mark.parametrize("preset", preset_names())
def test_allocated_memory_never_exceeds_the_bound_plus_one_slot(tiny_model, preset, budget):
    """Buffers hold at most ``min(plan.bound + 1, prompt + new)`` slots (the bound plus the appended
    slot), and an unbounded layer what it holds plus the tokens still to come (a prompt-only method
    frees what it evicted), for every method and preset, at every step; ragged heads their own slots
    plus what each may still receive; a budget far above the prompt allocates nothing it cannot use."""
    method = build_preset(preset)
    budget = budget if method.traits.budget_applies else None
    seen = PROMPT + NEW - 1  # tokens ever appended

    def check(cache) -> None:
        for layer in cache.layers:
            to_come = seen - layer.get_seq_length()
            if layer.store.kind == "ragged":  # the heads' own slots and what each may still receive
                r = layer.store
                room = torch.where(r.grows, r.lengths + to_come, r.bounds + 1).sum()
                index = 2 * r.segment.nbytes + 3 * r.offsets.nbytes
                assert (
                    layer.store.allocated_bytes()
                    <= room * sum(t[:1].nbytes for t in r.buffers.values()) + index
                )
                continue
            bound = layer.plan.bound
            # an unbounded layer: what it holds plus the tokens still to come (no more)
            slots = min(seen, layer.store.n_slots + to_come) if bound is None else min(bound + 1, seen)
            aux = sum(t.untyped_storage().nbytes() for t in layer.aux.values())
            assert layer.store.allocated_bytes() <= slots * slot_bytes(layer) + aux, (
                layer.spec.layer_idx,
                layer.store.n_slots,
            )
            if bound is not None:
                assert layer.store.n_slots <= bound

    greedy_generate(tiny_model, prompt(5), method, budget, NEW, set(), check)
