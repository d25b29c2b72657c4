"""The slot store's operations (methods/seam/uniform.py) against plain-tensor definitions, and its
fixed-capacity promise: a full layer's decode steps never reallocate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from methods import H2O, CompressedLayer, SlotStore, SnapKV, StreamingLLM
from methods.seam.step import prefill_step
from methods.seam.uniform import gather_slots
from runners.generation.greedy import greedy_generate


def filled(n: int = 6, cap: int = 8) -> tuple[SlotStore, dict[str, torch.Tensor]]:
    """A store of 2 x 3 heads holding ``n`` random slots (keys/values head_dim 4, a score field)."""
    store = SlotStore({"scores": 0.0}, lambda needed: max(needed, cap))
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, n, 4, generator=gen), torch.randn(2, 3, n, 4, generator=gen)
    store.append(keys, values, torch.arange(n))
    scores = torch.rand(2, 3, n, generator=gen)
    store.write("scores", scores)
    return store, {
        "keys": keys,
        "values": values,
        "positions": torch.arange(n).expand(2, 3, n),
        "scores": scores,
    }


def test_append_fills_defaults_and_keeps_capacity():
    store, ref = filled()
    assert store.n == 6 and store.capacity == 8
    assert torch.equal(store.view("log_weight"), torch.zeros(2, 3, 6))
    assert torch.equal(store.view("positions"), ref["positions"])
    store.append(torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 4), torch.tensor([6]))
    assert store.n == 7 and store.capacity == 8 and store.view("scores")[..., -1].eq(0).all()


@pytest.mark.parametrize("smaller", [True, False])
def test_keep_gathers_per_head_and_releases_the_old_buffers(smaller):
    """Smaller buffers when the capacity rule asks for fewer slots (a prompt compressed at prefill:
    the old ones released); in place when it asks for as many (a compression between decode steps)."""
    store, ref = filled()
    if smaller:
        store.capacity_for = lambda needed: needed
    old = store.buffers["keys"].untyped_storage().data_ptr()
    index = torch.tensor([[[0, 2, 5], [1, 3, 4], [5, 4, 0]]] * 2)
    store.keep(index)
    assert store.n == 3 and store.capacity == (4 if smaller else 8)
    assert (store.buffers["keys"].untyped_storage().data_ptr() != old) == smaller
    for name in ("keys", "values", "scores", "positions"):
        assert torch.equal(store.view(name), gather_slots(ref[name], index))


def test_drop_moves_the_last_slot_into_the_victim():
    store, ref = filled()
    victim = torch.tensor([[0, 5, 2], [3, 3, 1]])
    store.drop(victim)
    assert store.n == 5
    for b in range(2):
        for h in range(3):
            expected = list(range(6))
            expected[victim[b, h]] = 5
            expected = expected[:5]
            assert store.view("positions")[b, h].tolist() == expected
            assert torch.equal(store.view("keys")[b, h], ref["keys"][b, h, expected])


def test_swap_replace_merge_into_and_write():
    store, ref = filled()
    a, b = torch.zeros(2, 3, dtype=torch.long), torch.full((2, 3), 4)
    store.swap(a, b)
    assert torch.equal(store.view("keys")[:, :, 0], ref["keys"][:, :, 4])
    assert torch.equal(store.view("keys")[:, :, 4], ref["keys"][:, :, 0])
    slot = torch.full((2, 3, 1), 2)
    store.replace(slot, positions=-1, scores=torch.full((2, 3, 1), 7.0))
    assert store.view("positions")[..., 2].eq(-1).all() and store.view("scores")[..., 2].eq(7).all()
    w_t, w_s = torch.full((2, 3, 1), 3.0), torch.full((2, 3, 1), 1.0)
    source = torch.full((2, 3, 1), 1)
    store.merge_into(slot, source, w_t, w_s)
    expected = (3 * ref["keys"][:, :, 2] + ref["keys"][:, :, 1]) / 4  # ZSMerge Eq. 7
    torch.testing.assert_close(store.view("keys")[:, :, 2], expected)
    store.write("scores", torch.ones(2, 3, 6))
    assert store.view("scores").eq(1).all()


def test_reset_fills_missing_fields():
    store, ref = filled()
    store.reset(
        keys=ref["keys"][:, :, :2], values=ref["values"][:, :, :2], positions=ref["positions"][..., :2]
    )
    assert store.n == 2 and store.view("scores").eq(0).all() and store.view("log_weight").eq(0).all()


def test_a_full_layer_decodes_in_place():
    """Once an H2O layer holds its budget, each decode step appends into and evicts from the same
    buffers: no allocation, the same shapes at every step."""
    method, budget = H2O(), 8
    layer = CompressedLayer(method.traits.state_fill, budget, max_tokens=40)
    gen = torch.Generator().manual_seed(1)
    layer.update(torch.randn(1, 2, 16, 4, generator=gen), torch.randn(1, 2, 16, 4, generator=gen))
    prefill_step(method, layer, torch.randn(1, 2, 16, 4, generator=gen), None, None, 0.5)
    ptrs = {name: buf.data_ptr() for name, buf in layer.store.buffers.items()}
    for _ in range(20):
        layer.update(torch.randn(1, 2, 1, 4, generator=gen), torch.randn(1, 2, 1, 4, generator=gen))
        assert layer.keys.shape == (1, 2, budget + 1, 4)
        method.decode_step(layer, torch.softmax(torch.randn(1, 2, budget + 1, generator=gen), -1))
        assert layer.store.n_slots == budget
    assert {name: buf.data_ptr() for name, buf in layer.store.buffers.items()} == ptrs
    assert layer.store.capacity == budget + 1


def test_the_layer_views_are_read_only():
    layer = CompressedLayer(H2O().traits.state_fill, 4)
    layer.update(torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4))
    with pytest.raises(TypeError):
        layer.store.state["scores"] = torch.zeros(1, 1, 6)
    with pytest.raises(AttributeError):
        layer.keys = torch.zeros(1, 1, 6, 4)


def test_each_layer_is_planned_once_per_sample_and_sized_from_its_plan(tiny_model, monkeypatch):
    """The plan is made once per layer and sample when the prompt arrives; buffers follow it
    (no call back into the method while sizing) and decode steps evict down to it."""
    calls = []
    plan = H2O.plan
    monkeypatch.setattr(
        H2O, "plan", lambda self, layer: calls.append(layer.spec.layer_idx) or plan(self, layer)
    )
    ids = torch.randint(3, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    method, budget = H2O(state_rank=2), 12
    capacities = set()

    def check(cache) -> None:
        capacities.update(layer.store.capacity - layer.plan.bound for layer in cache.layers)

    res = greedy_generate(tiny_model, ids, method, budget, 6, set(), check)
    assert sorted(calls) == [0, 1] and len(res.tokens) == 6 and capacities == {1}
    layer = CompressedLayer(method.traits.state_fill, budget)
    layer.update(torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16))
    planned = method.plan(layer)
    bound = planned.bound
    assert bound > budget and planned.recent == method.split(bound)[1]  # Baseline+ extra slots
    prefill_step(method, layer, torch.randn(1, 6, 30, 16), None, None, 0.25)
    assert layer.store.n_slots == bound and layer.store.capacity == bound + 1


def test_the_dispatch_follows_what_the_method_declares():
    """``decode_input = "none"`` without bias: fused SDPA and nothing returned; a ``score_decay``:
    the scores updated in place and ``probs=None``; else the group-mean probabilities."""
    gen = torch.Generator().manual_seed(3)
    keys, values = torch.randn(1, 2, 9, 8, generator=gen), torch.randn(1, 2, 9, 8, generator=gen)
    query = torch.randn(1, 4, 1, 8, generator=gen)
    outs = []
    for method in (StreamingLLM(), H2O(), SnapKV(decode_budget=True)):
        layer = CompressedLayer(method.traits.state_fill, 20)
        layer.update(keys, values)
        layer.plan = method.plan(layer)
        if "scores" in method.traits.state_fill:
            layer.store.write("scores", torch.ones(1, 2, 9))
        out, probs = method.decode_attention(layer, query, 0.5)
        outs.append(out)
        if isinstance(method, StreamingLLM):
            assert probs is None
        elif isinstance(method, H2O):
            total = layer.store.state["scores"].sum(-1)  # 9 ones + this step's probabilities
            assert probs is None and torch.allclose(total, torch.full((1, 2), 10.0))
        else:
            assert probs.shape == (1, 2, 9) and torch.allclose(probs.sum(-1), torch.ones(1, 2))
    sdpa = F.scaled_dot_product_attention(query, keys, values, scale=0.5, enable_gqa=True)
    for out in outs:
        torch.testing.assert_close(out, sdpa)


@pytest.mark.parametrize("q_heads", [4, 8])
def test_the_masked_cpu_step_attention_is_sdpa_over_the_valid_slots(q_heads):
    """The compiled growing step's attention (``masked_sdpa``: ATen's CPU flash kernel, each KV
    head's query heads as rows, GQA 2 and 4 query heads a KV head) equals SDPA over the valid slots
    alone; the slots past the count hold garbage that must not leak in."""
    from kernels.decode_attention import masked_sdpa

    gen = torch.Generator().manual_seed(0)
    query = torch.randn(3, q_heads, 1, 16, generator=gen)
    keys, values = torch.randn(2, 3, 2, 40, 16, generator=gen)
    valid = (torch.arange(40) < 29).view(1, 1, -1)
    keys[:, :, 29:], values[:, :, 29:] = 1e4, -1e4  # past the count
    want = F.scaled_dot_product_attention(
        query, keys[:, :, :29], values[:, :, :29], scale=0.3, enable_gqa=True
    )
    torch.testing.assert_close(masked_sdpa(query, keys, values, valid, 0.3), want)
