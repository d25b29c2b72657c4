"""One prefill for a grid of settings (``runners.shared_prefill``): every setting's tokens, slots and
bytes are those of its own run."""

from __future__ import annotations

import pytest
import torch

from methods import FullKV
from runners.generate import greedy_generate
from runners.shared_prefill import shared_generate
from tests.architectures import tiny_family
from tests.test_method_matrix import build_preset

PROMPT, QUESTION, NEW = 56, 8, 10
PRESETS = ("snapkv", "h2o", "streamingllm", "keepkv", "adakv_snapkv", "pyramidkv")


def settings(budget: int) -> list:
    return [(FullKV(), None)] + [(build_preset(p), budget) for p in PRESETS]


def own_runs(model, ids, grid, start):
    return [greedy_generate(model, ids, m, b, NEW, {2}, question_start=start) for m, b in grid]


@pytest.mark.parametrize("start", [None, PROMPT - QUESTION], ids=["query_aware", "query_agnostic"])
def test_shared_prefill_equals_each_settings_own_run(tiny_model, start):
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    grid = settings(20)
    shared = shared_generate(tiny_model, ids, grid, NEW, {2}, question_start=start)
    own = own_runs(tiny_model, ids, settings(20), start)
    for (method, _), a, b in zip(grid, shared, own, strict=True):
        assert (a.tokens, a.slots, a.kv_bytes, a.allocated_bytes) == (b.tokens, b.slots, b.kv_bytes,
                                                                       b.allocated_bytes), method.label  # fmt: skip
        assert a.prefill_slots == b.prefill_slots and a.prefill_head_slots == b.prefill_head_slots
    assert len({tuple(r.tokens) for r in shared}) > 1  # the settings do differ


def test_shared_prefill_on_sliding_layers_with_softcap():
    """Gemma-2: interleaved sliding-window layers (their own rule) and logit soft-capping."""
    model = tiny_family("gemma2")
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(6))
    grid = [(FullKV(), None), (build_preset("snapkv"), 12), (build_preset("h2o"), 12)]
    shared = shared_generate(model, ids, grid, NEW, {2}, question_start=PROMPT - QUESTION)
    own = own_runs(model, ids, grid, PROMPT - QUESTION)
    assert [(r.tokens, r.slots) for r in shared] == [(r.tokens, r.slots) for r in own]
