"""KVMerger against its paper: Algorithm 1 set properties, Algorithm 2 weights, exact budget."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from methods import CompressedLayer, KVMerger
from methods.scoring import causal_column_sums
from methods.seam.step import prefill_step

B, H, HQ, D = 2, 2, 6, 8
SCALE = D**-0.5


def similar_keys(length: int, seed: int) -> torch.Tensor:
    """Random keys with runs of near-duplicates, so merging sets of several tokens exist."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(B, H, length // 5 + 1, D, generator=gen, dtype=torch.float64)
    keys = base.repeat_interleave(5, dim=2)[:, :, :length]
    return keys + 0.3 * torch.randn(B, H, length, D, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("theta", [0.5, 0.75, 0.9])
def test_merging_sets_are_contiguous_unprotected_and_similar_to_their_anchor(theta):
    method = KVMerger(theta=theta)
    keys = similar_keys(80, 0)
    acc = torch.rand(B, H, 80, generator=torch.Generator().manual_seed(1))
    protected = method._protected(acc, *method.protected_counts(80, None))
    assert int(protected[0, 0].sum()) == int(0.17 * 80) + int(0.12 * 80)
    set_id = method._anchor_sets(keys, protected)
    unit = F.normalize(keys, dim=-1)
    sizes = []
    for b in range(B):
        for h in range(H):
            ids = set_id[b, h].tolist()
            assert all(ids[i] >= ids[i + 1] for i in range(79))  # ids grow from the last token: contiguous
            for s in set(ids):
                members = [i for i in range(80) if ids[i] == s]
                sizes.append(len(members))
                if len(members) > 1:
                    assert not protected[b, h, members].any()
                    anchor = max(members)
                    assert all(
                        float(unit[b, h, i] @ unit[b, h, anchor]) > theta for i in members if i != anchor
                    )
    assert max(sizes) > 1


def test_gaussian_merge_weights_pivot_and_sum_to_one():
    method = KVMerger(theta=0.6)
    length = 60
    keys = similar_keys(length, 2)
    values = torch.eye(length, dtype=torch.float64).expand(B, H, length, length).clone()  # one-hot: weights
    query = torch.randn(B, HQ, length, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    layer = CompressedLayer(method.traits.state_fill, None)
    layer.update(keys, values)
    prefill_step(method, layer, query, None, None, SCALE)
    acc = causal_column_sums(query, keys, SCALE)
    protected = method._protected(acc, *method.protected_counts(length, None))
    set_id = method._anchor_sets(keys, protected)
    for b in range(B):
        for h in range(H):
            real = torch.isfinite(layer.store.log_weight[b, h])
            torch.testing.assert_close(
                layer.values[b, h, real].sum(-1), torch.ones(int(real.sum()), dtype=torch.float64)
            )
            assert int(real.sum()) == len(set(set_id[b, h].tolist()))
            for slot in torch.nonzero(real).flatten().tolist():
                pivot = layer.store.positions[b, h, slot].item()
                members = torch.nonzero(set_id[b, h] == set_id[b, h, pivot]).flatten()
                assert pivot == members[acc[b, h, members].argmax()].item()
                dist = (keys[b, h, members] - keys[b, h, pivot]).norm(dim=-1)
                sigma = dist.sum() / max(1, len(members) - 1)
                g = torch.exp(-(dist**2) / (2 * sigma**2)) if sigma > 0 else torch.ones_like(dist)
                w = g / g.sum()
                torch.testing.assert_close(layer.values[b, h, slot, members], w)
                torch.testing.assert_close(layer.keys[b, h, slot], (w[:, None] * keys[b, h, members]).sum(0))


def test_fixed_theta_pads_heads_with_unattendable_slots():
    method = KVMerger(theta=0.6)
    layer = CompressedLayer(method.traits.state_fill, 10)
    keys = similar_keys(70, 4)
    layer.update(keys, keys)
    prefill_step(method, layer, torch.randn(B, HQ, 70, D, dtype=torch.float64), None, None, SCALE)
    counts = torch.isfinite(layer.store.log_weight).sum(-1)
    assert layer.store.n_slots == int(counts.max()) and int(counts.min()) < 70
    assert torch.all(layer.store.positions[~torch.isfinite(layer.store.log_weight)] == -1)


@pytest.mark.parametrize("budget", [7, 20, 35])
def test_exact_budget_hits_the_slot_count_on_every_head(budget):
    method = KVMerger(exact_budget=True)
    layer = CompressedLayer(method.traits.state_fill, budget)
    keys = similar_keys(70, 5)
    layer.update(keys, keys)
    prefill_step(method, layer, torch.randn(B, HQ, 70, D, dtype=torch.float64), None, None, SCALE)
    assert layer.store.n_slots == budget and torch.isfinite(layer.store.log_weight).all()
    recent, heavy = method.protected_counts(70, budget)
    assert recent + heavy <= budget


def test_fixed_theta_ignores_the_budget_and_says_so(tiny_model):
    """With a fixed theta the kept ratio is an outcome: runners record no budget for it."""
    from methods import FullKV
    from runners.generation.greedy import greedy_generate

    assert not KVMerger().traits.budget_applies and KVMerger(exact_budget=True).traits.budget_applies
    assert not FullKV().traits.budget_applies
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(0))
    with_budget = greedy_generate(tiny_model, ids, KVMerger(), 10, 8, set())
    without = greedy_generate(tiny_model, ids, KVMerger(), None, 8, set())
    assert with_budget.tokens == without.tokens and with_budget.prefill_slots == without.prefill_slots
