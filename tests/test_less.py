"""LESS inference against its definition (docs/methods.md, "LESS"): shapes and GQA, the state equals
the explicit sum over evicted tokens, the log-space decode equals the plain formula, and a zero
state reduces LESS to its sparse policy exactly."""

from __future__ import annotations

import pytest
import torch

from methods import H2O, LESS, CompressedLayer
from methods.seam.step import prefill_step
from runners.generation.greedy import greedy_generate
from tests.method_settings import HKV, HQ, SCALE, B, D, R, tiny_kernels


def test_feature_maps_are_non_negative_with_gqa_shapes():
    kernels = tiny_kernels(1)[0]
    phi = kernels.phi(torch.randn(B, HQ, 5, D))
    psi = kernels.psi(torch.randn(B, HKV, 5, D))
    assert phi.shape == (B, HQ, 5, R) and psi.shape == (B, HKV, 5, R)
    assert (phi >= 0).all() and (psi >= 0).all() and psi.sum() > 0


@pytest.mark.parametrize("policy", ["h2o", "lambda"])
def test_state_is_the_sum_over_evicted_tokens(policy):
    method = LESS(policy=policy, kernels=tiny_kernels(1))
    gen = torch.Generator().manual_seed(0)
    layer = CompressedLayer(method.traits.state_fill, budget=12)
    keys, values = torch.randn(B, HKV, 30, D, generator=gen), torch.randn(B, HKV, 30, D, generator=gen)
    layer.update(keys, values)
    prefill_step(method, layer, torch.randn(B, HQ, 30, D, generator=gen), None, None, SCALE)
    for _ in range(5):  # decode steps: append, attend, evict one
        k, v = torch.randn(B, HKV, 1, D, generator=gen), torch.randn(B, HKV, 1, D, generator=gen)
        keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        layer.update(k, v)
        _, probs = method.decode_attention(layer, torch.randn(B, HQ, 1, D, generator=gen), SCALE)
        method.decode_step(layer, probs)
        assert layer.store.n_slots == 12
    psi = method.kernels[0].psi(keys)
    for h in range(HKV):
        kept = set(layer.store.positions[0, h].tolist())
        gone = [p for p in range(keys.shape[2]) if p not in kept]
        assert len(gone) == keys.shape[2] - 12
        h_state = sum(torch.outer(psi[0, h, p], values[0, h, p]) for p in gone)
        assert torch.allclose(layer.aux["H"][0, h], h_state, atol=1e-5)
        assert torch.allclose(layer.aux["z"][0, h], psi[0, h, gone].sum(0), atol=1e-5)
        if policy == "lambda":
            assert sorted(kept) == [*range(6), *range(keys.shape[2] - 6, keys.shape[2])]


def test_log_space_decode_equals_the_plain_formula():
    method = LESS(kernels=tiny_kernels(1))
    gen = torch.Generator().manual_seed(1)
    layer = CompressedLayer(method.traits.state_fill, budget=None)
    layer.update(torch.randn(B, HKV, 10, D, generator=gen), torch.randn(B, HKV, 10, D, generator=gen))
    layer.aux = {"H": torch.randn(B, HKV, R, D, generator=gen), "z": torch.rand(B, HKV, R, generator=gen) * 5}
    query = torch.randn(B, HQ, 1, D, generator=gen)
    out, _ = method.decode_attention(layer, query, SCALE)
    phi = method.kernels[0].phi(query).double()
    for hq in range(HQ):
        h = hq // (HQ // HKV)
        e = torch.exp(layer.keys[0, h].double() @ query[0, hq, 0].double() * SCALE)
        num = e @ layer.values[0, h].double() + phi[0, hq, 0] @ layer.aux["H"][0, h].double()
        den = e.sum() + phi[0, hq, 0] @ layer.aux["z"][0, h].double()
        assert torch.allclose(out[0, hq, 0].double(), num / den, atol=1e-5)


@pytest.mark.parametrize("logit", [-100.0, 100.0])
@pytest.mark.parametrize("empty_state", [True, False])
def test_decode_is_finite_for_extreme_logits_and_an_empty_state(logit, empty_state):
    """Every logit near -100 or +100 (Qwen2.5-class models reach lse = -101), with nothing evicted
    yet (H = z = 0) or a live state: finite, and equal to the plain formula in float64."""
    method = LESS(kernels=tiny_kernels(1))
    gen = torch.Generator().manual_seed(2)
    layer = CompressedLayer(method.traits.state_fill, budget=None)
    direction = torch.ones(B, HKV, 10, D)
    layer.update(
        direction + 0.01 * torch.randn(B, HKV, 10, D, generator=gen),
        torch.randn(B, HKV, 10, D, generator=gen),
    )
    query = torch.ones(B, HQ, 1, D) * (logit / (D * SCALE))  # q . k * scale ~= logit for every slot
    if empty_state:
        layer.aux = {"H": torch.zeros(B, HKV, R, D), "z": torch.zeros(B, HKV, R)}
    else:
        layer.aux = {"H": torch.randn(B, HKV, R, D, generator=gen), "z": torch.rand(B, HKV, R, generator=gen)}
    out, probs = method.decode_attention(layer, query, SCALE)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    phi = method.kernels[0].phi(query).double()
    for hq in range(HQ):
        h = hq // (HQ // HKV)
        logits = layer.keys[0, h].double() @ query[0, hq, 0].double() * SCALE
        shift = logits.max()  # the plain formula, rescaled by exp(-shift) in float64 to stay finite
        e = torch.exp(logits - shift)
        low = phi[0, hq, 0] * torch.exp(-shift)
        num = e @ layer.values[0, h].double() + low @ layer.aux["H"][0, h].double()
        den = e.sum() + low @ layer.aux["z"][0, h].double()
        assert torch.allclose(out[0, hq, 0].double(), num / den, atol=1e-4)


@pytest.mark.parametrize("budget", [10, 24])
def test_zero_state_is_exactly_h2o(tiny_model, budget):
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(3))
    h2o = greedy_generate(tiny_model, ids, H2O(), budget, 12, set())
    less = greedy_generate(tiny_model, ids, LESS(kernels=tiny_kernels(scale=0.0)), budget, 12, set())
    assert less.tokens == h2o.tokens and less.slots == h2o.slots
    trained = greedy_generate(tiny_model, ids, LESS(kernels=tiny_kernels(scale=1.0)), budget, 12, set())
    assert trained.kv_bytes == h2o.kv_bytes + 2 * HKV * (R * D + R) * 4  # state counted, 2 layers


def test_missing_kernels_is_a_clear_error(tiny_model):
    ids = torch.randint(0, 128, (1, 20))
    with pytest.raises(RuntimeError, match="no kernels for layer 0"):
        greedy_generate(tiny_model, ids, LESS(), 8, 2, set())


def test_h2o_plus_holds_the_bytes_of_a_less_state(tiny_model):
    """H2O Baseline+: the extra slots cost at least the state's bytes, and less than one slot more."""
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(4))
    less = greedy_generate(tiny_model, ids, LESS(kernels=tiny_kernels()), 12, 6, set())
    plus = greedy_generate(tiny_model, ids, H2O(state_rank=R), 12, 6, set())
    slot = 2 * HKV * 2 * D * 4  # one slot on every head of both layers, K and V, fp32
    assert plus.slots == [12 + 5, 12 + 5]  # ceil((8 * 16 + 8) * 4 / (2 * 16 * 4)) = 5
    assert less.kv_bytes <= plus.kv_bytes < less.kv_bytes + slot
