"""Batched generation (``runners.generation.batched``, ``runners.generation.rows``): prompts of different
lengths decode together, each on its own cache, and every row's tokens, slots and bytes are those of its
batch-1 run (:func:`runners.generation.greedy.greedy_generate`), for every method, and on every
architecture family for a method of each kind (``KINDS``)."""

from __future__ import annotations

import pytest
import torch

from methods import METHOD_REGISTRY, FullKV
from methods.seam.cache import CompressedCache
from runners.generation.batched import decode_rows, start_row
from runners.generation.greedy import greedy_generate
from runners.generation.rows import RowsCache
from tests.architectures import FAMILIES, tiny_family
from tests.method_settings import CASES, build_preset, preset_names

LENGTHS = (40, 57, 33, 64, 48)  # five prompts, all different
NEW, BUDGET, BATCH = 12, 20, 3
#: Presets a user must complete (a gate pattern, per-layer ratios): covered by CASES on tiny Llama.
USER_INPUT = ("duo_attention", "layer_ratios")
#: On the other families, one preset of each kind of cache work: uniform and ragged eviction, prompt-only
#: and per step, merging with a log-weight bias, growing, and sink re-rotation with the family's RoPE.
#: Every preset runs on Llama; what batching could break per family is its layers, not the rule.
KINDS = ("fullkv", "snapkv", "h2o", "adakv_snapkv", "zsmerge", "kvmerger", "keepkv", "streamingllm")
FIELDS = ("tokens", "slots", "kv_bytes", "allocated_bytes", "prefill_slots", "prefill_head_slots", "counters")


def prompts(seed: int = 0) -> list[torch.Tensor]:
    return [
        torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed + i))
        for i, n in enumerate(LENGTHS)
    ]


def random_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Random norm weights: with the init's unit weights, QK-norm (Qwen3, Gemma-3) gives every key
    the same norm, so a norm-based ranking (KNorm) would be decided by rounding, and batching the
    linear layers changes rounding (never the method's rule)."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
    return model


def batched(model, ids: list[torch.Tensor], method, budget, batch: int, **row_kwargs) -> list:
    """Results in prompt order; ``row_kwargs`` values are per-row lists."""
    rows = [
        (i, lambda i=i: start_row(model, ids[i], method, budget, **{k: v[i] for k, v in row_kwargs.items()}))
        for i in range(len(ids))
    ]
    out = dict(decode_rows(rows, batch))
    return [out[i] for i in range(len(ids))]


def same(a, b) -> bool:
    return [getattr(a, f) for f in FIELDS] == [getattr(b, f) for f in FIELDS]


@pytest.mark.parametrize("family", FAMILIES)
def test_presets_batched_equal_batch_one_on_every_family(family):
    model = random_norms(tiny_family(family))
    ids = prompts()
    limits = {"max_new_tokens": [NEW] * len(ids), "eos_token_ids": [{2}] * len(ids)}
    names = ["fullkv", *(n for n in preset_names() if n not in USER_INPUT and n != "fullkv")]
    if family != "llama":
        names = [n for n in names if n in KINDS]
        assert len(names) == len(KINDS)  # every kind is still a preset
    for name in names:
        method, budget = (FullKV(), None) if name == "fullkv" else (build_preset(name), BUDGET)
        own = [greedy_generate(model, p, method, budget, NEW, {2}) for p in ids]
        rows = batched(model, ids, method, budget, BATCH, **limits)
        assert all(same(a, b) for a, b in zip(rows, own, strict=True)), f"{family} {name}"


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_every_registered_method_batched_equals_batch_one(tiny_model, name, kwargs, budget):
    """Every registered method at a mild and a harsh setting (tests/method_settings.py)."""
    ids = [torch.randint(3, 128, (1, 64), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    own = [greedy_generate(tiny_model, p, METHOD_REGISTRY[name](**kwargs), budget, NEW, set()) for p in ids]
    limits = {"max_new_tokens": [NEW] * 3, "eos_token_ids": [set()] * 3}
    rows = batched(tiny_model, ids, METHOD_REGISTRY[name](**kwargs), budget, 3, **limits)
    assert all(same(a, b) for a, b in zip(rows, own, strict=True))


def test_each_row_keeps_its_own_limits_and_question(tiny_model):
    """Rows differ in max tokens, stop ids, min tokens and query-agnostic question starts; rows end
    at different steps and the next prompt takes their place."""
    ids = prompts(3)
    own_args = [
        (NEW, {2}, 0, None), (4, {2}, 0, 30), (NEW, {2, 7}, 3, None), (1, {2}, 0, None), (9, set(), 0, 40),
    ]  # fmt: skip
    method = build_preset("h2o")
    own = [
        greedy_generate(tiny_model, p, method, BUDGET, new, eos, min_new_tokens=m, question_start=q)
        for p, (new, eos, m, q) in zip(ids, own_args, strict=True)
    ]
    columns = dict(zip(("max_new_tokens", "eos_token_ids", "min_new_tokens", "question_start"),
                       map(list, zip(*own_args, strict=True)), strict=True))  # fmt: skip
    rows = batched(tiny_model, ids, method, BUDGET, 2, **columns)
    assert all(same(a, b) for a, b in zip(rows, own, strict=True))
    assert len({len(r.tokens) for r in rows}) > 2  # the rows did end at different steps
    assert all(len(r.step_seconds) == len(r.tokens) - 1 for r in rows)


def test_rows_of_different_methods_decode_together(tiny_model):
    """A grid's settings of one prompt: each row follows its own method."""
    ids = prompts(5)[3]
    grid = [(FullKV(), None), (build_preset("snapkv"), BUDGET), (build_preset("streamingllm"), BUDGET)]
    own = [greedy_generate(tiny_model, ids, m, b, NEW, {2}) for m, b in grid]
    rows = [(i, lambda m=m, b=b: start_row(tiny_model, ids, m, b, NEW, {2})) for i, (m, b) in enumerate(grid)]
    out = dict(decode_rows(rows, len(grid)))
    assert all(same(out[i], own[i]) for i in range(len(grid)))
    assert len({tuple(r.tokens) for r in own}) > 1


def test_rows_cache_refuses_what_it_cannot_decode(tiny_model):
    empty = CompressedCache.for_model(tiny_model, FullKV(), None)
    with pytest.raises(ValueError, match="prefilled caches only"):
        RowsCache([empty])
    with pytest.raises(ValueError, match="at least one cache"):
        RowsCache([])
    row = start_row(tiny_model, prompts()[0], FullKV(), None, 4, {2})
    cache = RowsCache([row.run.cache])
    keys = torch.zeros(2, 2, 1, 16)
    with pytest.raises(ValueError, match="one token for each of its 1 rows"):
        cache.update(keys, keys, 0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        list(decode_rows([], 0))
