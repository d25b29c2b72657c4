"""One shared matrix: every method x a mild and a harsh setting, checked against invariants
on a tiny random GQA Llama (budget never exceeded, bytes match slots, a covering budget gives
FullKV's output, determinism)."""

from __future__ import annotations

import pytest
import torch

from methods import METHOD_REGISTRY, FullKV
from runners.generate import greedy_generate
from tests.test_less import tiny_kernels

PROMPT, NEW = 64, 16
BYTES_PER_SLOT = 2 * 2 * 16 * 4  # kv_heads x head_dim x (K, V) x fp32, one layer

SETTINGS = {
    "fullkv": ({}, {}),
    "zsmerge": ({}, {"alpha": 0.5, "residual_ratio": 3, "order": "paper", "lam": 0.5}),
    "h2o": ({}, {"heavy_ratio": 0.75, "recent_ratio": 0.25, "chunk_size": 7}),
    "snapkv": ({}, {"window_size": 4, "kernel_size": 3, "pooling": "avg", "decode_budget": True}),
    "streamingllm": ({}, {"n_sink": 1, "rerotate": False}),
    # fixed theta makes the slot count an outcome (tests/test_kvmerger.py); the matrix needs a budget
    "keepkv": ({}, {"estimator": "window_mean", "merge": "convex", "threshold": 0.3, "n_sink": 1}),
    # LESS needs trained kernels: random ones with a non-zero state here (tests/test_less.py)
    "less": ({"kernels": tiny_kernels()}, {"policy": "lambda", "kernels": tiny_kernels()}),
    "kvmerger": ({"exact_budget": True}, {"exact_budget": True, "recent_ratio": 0.08, "heavy_ratio": 0.02}),
}
CASES = [
    pytest.param(name, kwargs, budget, id=f"{name}-{level}")
    for name, pair in SETTINGS.items()
    for level, kwargs, budget in (("mild", pair[0], 40), ("harsh", pair[1], 10))
]


def test_every_registered_method_is_in_the_matrix():
    assert set(SETTINGS) == set(METHOD_REGISTRY)


def prompt(seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_budget_and_memory_at_every_step(tiny_model, name, kwargs, budget):
    method = METHOD_REGISTRY[name](**kwargs)
    steps = []

    def check(cache) -> None:
        steps.append(cache.n_slots)
        allowed = PROMPT + len(steps) - 1
        if method.compresses:
            allowed = budget if method.budget_holds_in_decode else budget + len(steps) - 1
        assert max(cache.n_slots) <= allowed
        state = sum(t.nbytes for layer in cache.layers for t in layer.aux.values())  # LESS's H, z
        assert cache.kv_bytes() == sum(cache.n_slots) * BYTES_PER_SLOT + state

    res = greedy_generate(
        tiny_model, prompt(0), method, budget if method.compresses else None, NEW, set(), check
    )
    assert len(steps) == NEW
    if method.compresses:
        assert res.kv_bytes < res.fullkv_bytes  # memory was really released


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_covering_budget_gives_fullkv_output(tiny_model, name, kwargs, budget):
    ids = prompt(1)
    full = greedy_generate(tiny_model, ids, FullKV(), None, NEW, set()).tokens
    covering = PROMPT + NEW if METHOD_REGISTRY[name](**kwargs).budget_holds_in_decode else PROMPT
    out = greedy_generate(tiny_model, ids, METHOD_REGISTRY[name](**kwargs), covering, NEW, set()).tokens
    assert out == full


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_same_input_same_output(tiny_model, name, kwargs, budget):
    runs = [
        greedy_generate(tiny_model, prompt(2), METHOD_REGISTRY[name](**kwargs), budget, NEW, set())
        for _ in "ab"
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].slots == runs[1].slots
