"""KeepKV against its paper: Theorem 3 (ZIP-Merging is perturbation-free), Theorem 2 (attention
sag of convex merging), the guarded fallback, Eq. 8's EMA, selection and vote bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch

from methods import CompressedLayer, KeepKV
from methods.keepkv.partners import cosine_partners
from methods.keepkv.zip_merge import merge_groups
from methods.seam.architecture import LayerSpec
from methods.seam.step import prefill_step
from runners.generation.greedy import greedy_generate

D = 16
SCALE = D**-0.5


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, log_votes: torch.Tensor
) -> torch.Tensor:
    """Eq. 6: ``o = sum p_i s_i v_i / sum p_i s_i`` for one query ``[d]`` over ``[n, d]`` slots."""
    return torch.softmax(keys @ q * SCALE + log_votes, dim=-1) @ values


def random_cache(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(D, generator=gen, dtype=torch.float64)
    # keys leaning towards q keep every logit well away from 0 (the ZIP denominator's singularity)
    keys = torch.randn(n, D, generator=gen, dtype=torch.float64) + 1.5 * q / q.norm()
    values = torch.randn(n, D, generator=gen, dtype=torch.float64)
    log_votes = torch.log(torch.randint(1, 4, (n,), generator=gen).double())
    return q, keys, values, log_votes


def merge(keys, values, log_votes, log_score, target, groups, **kw):
    args = (t[None, None] for t in (keys, values, log_votes, log_score, target))
    out = merge_groups(*args, groups, **kw)
    return out.keys[0, 0], out.values[0, 0], out.log_votes[0, 0], out


@pytest.mark.parametrize(("seed", "members"), [(0, [5]), (1, [2]), (2, [0, 3, 7]), (3, [1, 9])])
def test_theorem3_zip_merge_leaves_the_output_unchanged(seed, members):
    """With exact current scores s = exp(q k * scale), merging into slot 4 changes nothing (1e-9)."""
    n, c = 10, 4
    q, keys, values, log_votes = random_cache(n, seed)
    before = attend(q, keys, values, log_votes)
    target = torch.arange(n)
    kept = [i for i in range(n) if i not in members]
    target[kept] = torch.arange(len(kept))
    target[members] = kept.index(c)
    k2, v2, lv2, out = merge(keys, values, log_votes, keys @ q * SCALE, target, len(kept))
    assert not out.fallback.any() and bool(out.merged[0, 0, kept.index(c)])
    assert torch.allclose(attend(q, k2, v2, lv2), before, atol=1e-9, rtol=0)
    # votes add up (Eq. 6) and the untouched slots are bit-identical
    assert math.isclose(lv2.exp().sum().item(), log_votes.exp().sum().item())
    others = [kept.index(i) for i in kept if i != c]
    assert torch.equal(k2[others], keys[[i for i in kept if i != c]])


def test_theorem2_convex_merge_shows_attention_sag():
    """Eq. 5 with w_e + w_c = 1 and no votes: A_r < A_e + A_c, so the output moves."""
    for seed in range(20):
        q, keys, values, _ = random_cache(6, seed)
        ones = torch.zeros(6, dtype=torch.float64)
        target = torch.tensor([0, 1, 2, 3, 4, 4])  # slot 5 merged into slot 4
        k2, v2, _, _ = merge(keys, values, ones, keys @ q * SCALE, target, 5, zip_keys=False)
        probs_before = torch.softmax(keys @ q * SCALE, dim=-1)
        probs_after = torch.softmax(k2 @ q * SCALE, dim=-1)  # one vote: the merge history is lost
        assert probs_after[4] < probs_before[4] + probs_before[5]
        assert (
            attend(q, k2, v2, torch.zeros(5, dtype=torch.float64)) - attend(q, keys, values, ones)
        ).norm() > 0


def test_zip_falls_back_to_the_convex_average_near_the_singularity():
    _, keys, values, _ = random_cache(4, 0)
    log_score = torch.tensor([1e-5, -1e-5, 0.3, 0.2], dtype=torch.float64)  # members' ln s straddle 0
    target = torch.tensor([0, 0, 1, 2])
    k2, _, _, out = merge(keys, values, torch.zeros(4, dtype=torch.float64), log_score, target, 3)
    assert out.fallback[0, 0].tolist() == [True, False, False]
    lam = torch.softmax(log_score[:2], dim=0)
    assert torch.allclose(k2[0], lam @ keys[:2])


def make_layer(method: KeepKV, length: int, budget: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    layer = CompressedLayer(method.traits.state_fill, budget)
    keys = torch.randn(1, 2, length, D, generator=gen)
    layer.update(keys, torch.randn(1, 2, length, D, generator=gen))
    query = torch.randn(1, 6, length, D, generator=gen)
    return layer, keys, query


def test_eq8_ema_initialisation_and_update():
    method = KeepKV(window=5)
    layer, keys, query = make_layer(method, 30, 100)  # budget covers the prompt: nothing evicted
    prefill_step(method, layer, query, None, None, SCALE)
    alpha = 1 - 2 / 6
    q = query.view(1, 2, 3, 30, D).double()
    s = torch.exp(torch.einsum("bhgqd,bhkd->bhgqk", q, keys.double()) * SCALE)
    s = s * torch.tril(torch.ones(30, 30, dtype=torch.float64))  # causal zeros
    s_mean = s.mean(dim=2)  # GQA: group mean of the unnormalised scores
    expected = sum((1 - alpha) * alpha ** (29 - t) * s_mean[..., t, :] for t in range(25, 30))
    assert torch.allclose(layer.store.state["log_ema"].double().exp(), expected, rtol=1e-5)
    logits = torch.randn(1, 2, 3, 30)
    method.decode_step(layer, logits)
    step = alpha * expected + (1 - alpha) * logits.double().exp().mean(dim=2)
    assert torch.allclose(layer.store.state["log_ema"].double().exp(), step, rtol=1e-5)
    corrected = method.scores.merge_score(layer).double().exp()
    assert torch.allclose(corrected, step / (1 - alpha**6), rtol=1e-5)


def test_selection_keeps_sinks_recent_and_top_estimated_attention():
    method = KeepKV(window=6, threshold=1.0)  # no cosine exceeds 1: pure eviction
    layer, _, query = make_layer(method, 60, 20, seed=1)
    prefill_step(method, layer, query, None, None, SCALE)
    layer2, _, _ = make_layer(method, 60, 100, seed=1)
    prefill_step(method, layer2, query, None, None, SCALE)  # same scores, no eviction
    score = layer2.store.state["log_ema"]
    for h in range(2):
        pos = layer.store.positions[0, h].tolist()
        assert pos[:4] == [0, 1, 2, 3] and pos[-6:] == list(range(54, 60)) and len(pos) == 20
        top = score[0, h, 4:54].topk(10).indices + 4
        assert sorted(pos[4:-6]) == sorted(top.tolist())
    assert layer.scalars["evictions"].sum() == 2 * 40 and layer.scalars["merges"].sum() == 0


@pytest.mark.parametrize(
    "preset", [{}, {"estimator": "window_mean", "merge": "convex", "layer_budgets": "cosine"}]
)
def test_votes_account_for_every_token(tiny_model, preset):
    """sum of votes + dropped tokens = tokens seen, on every layer and head, at every step."""
    method = KeepKV(threshold=0.2, **preset)
    budget = 16

    def check(cache) -> None:
        for layer in cache.layers:
            votes = float(layer.store.log_weight.exp().sum())
            heads = layer.store.log_weight.shape[1]
            dropped = float(layer.scalars["dropped_votes"].sum())
            assert math.isclose(votes + dropped, heads * layer.get_seq_length(), abs_tol=1e-2)
            assert layer.store.n_slots <= layer.plan.bound
            assert (
                layer.store.positions.eq(layer.get_seq_length() - 1).any(dim=-1).all()
            )  # the newest token is kept

    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(0))
    res = greedy_generate(tiny_model, ids, method, budget, 12, set(), check)
    assert res.counters["merges"] > 0


@pytest.mark.parametrize("preset", [{}, {"estimator": "window_mean", "merge": "convex"}])
def test_in_place_decode_eviction_equals_the_group_merge(preset):
    """The per-step in-place merge (victim + partner only) gives the same slots, votes, scores,
    keys and values as Algorithm 1's group merge over every slot with one slot over budget (the
    path of the prefill), on the same victim."""

    gen = torch.Generator().manual_seed(3)
    base = torch.randn(1, 2, 1, 16, generator=gen)
    keys = base + 0.6 * torch.randn(1, 2, 40, 16, generator=gen)  # similar keys: merges happen
    values = torch.randn(1, 2, 40, 16, generator=gen)
    method = KeepKV(threshold=0.5, **preset)
    layers = []
    for _ in "ab":
        layer = CompressedLayer(method.traits.state_fill, 20)
        layer.update(keys[:, :, :30], values[:, :, :30])
        prefill_step(
            method,
            layer,
            torch.randn(1, 6, 30, 16, generator=torch.Generator().manual_seed(1)),
            None,
            None,
            0.25,
        )
        layers.append(layer)
    fast, full = layers
    merge_evicted = method.merge_evicted
    for step in range(30, 40):
        logits = torch.randn(1, 2, 3, 21, generator=torch.Generator().manual_seed(step))
        for layer in layers:
            layer.update(keys[:, :, step : step + 1], values[:, :, step : step + 1])
        assert torch.equal(
            fast.store.positions.sort(-1).values, full.store.positions
        )  # the group path keeps order
        full_logits = logits.gather(-1, fast.store.positions.argsort(-1)[:, :, None].expand(-1, -1, 3, -1))
        method.decode_step(fast, logits)
        method.merge_evicted = lambda layer, evicted: merge_evicted(layer, evicted, in_place=False)
        try:
            method.decode_step(full, full_logits)
        finally:
            method.merge_evicted = merge_evicted
        order_fast, order_full = fast.store.positions.argsort(dim=-1), full.store.positions.argsort(dim=-1)
        name = "log_ema" if method.estimator == "ema" else "rows"
        for ours, theirs in (
            (fast.store.positions, full.store.positions),
            (fast.store.log_weight, full.store.log_weight),
            (fast.store.state[name], full.store.state[name]),
            (fast.keys, full.keys),
            (fast.values, full.values),
        ):
            i_ours = order_fast.view(*order_fast.shape, *[1] * (ours.dim() - 3)).expand_as(ours)
            i_theirs = order_full.view(*order_full.shape, *[1] * (theirs.dim() - 3)).expand_as(theirs)
            torch.testing.assert_close(
                ours.gather(2, i_ours), theirs.gather(2, i_theirs), atol=1e-5, rtol=1e-5
            )
    assert int(fast.scalars["merges"].sum()) == int(full.scalars["merges"].sum()) > 0


def test_cosine_layer_budgets_average_to_the_budget():
    method = KeepKV(layer_budgets="cosine")
    specs = [LayerSpec(layer_idx=i, num_layers=30) for i in range(30)]
    layers = [CompressedLayer(method.traits.state_fill, 200, spec) for spec in specs]
    budgets = [method.plan(layer).bound for layer in layers]
    assert budgets[0] > budgets[-1] and budgets == sorted(budgets, reverse=True)
    assert abs(sum(budgets) / 30 - 200) < 1.0


@pytest.mark.parametrize("k", [1, 7])
def test_partners_are_the_retained_slots_of_highest_key_cosine(k):
    """Algorithm 1 line 5, brute force: every evicted slot's partner is the retained slot of
    highest ``F.cosine_similarity`` with its key, and the returned cosine is that similarity; for a
    decode step's one slot (every other slot a candidate) and a prefill's many (the complement)."""
    from methods.scoring import complement
    from methods.seam.layer import CompressedLayer

    gen = torch.Generator().manual_seed(k)
    keys = torch.randn(2, 3, 24, D, generator=gen)
    layer = CompressedLayer(KeepKV().traits.state_fill, None)
    layer.update(keys, torch.zeros_like(keys))
    evicted = torch.stack([torch.randperm(24, generator=gen)[:k] for _ in range(6)]).view(2, 3, k)
    retained = None if k == 1 else complement(evicted, 24)
    best, partner = cosine_partners(layer, evicted, retained)
    for b in range(2):
        for h in range(3):
            for i, e in enumerate(evicted[b, h].tolist()):
                cos = torch.nn.functional.cosine_similarity(keys[b, h, e][None], keys[b, h], dim=-1)
                cos[evicted[b, h]] = -2.0
                assert int(partner[b, h, i]) == int(cos.argmax())
                assert float(best[b, h, i]) == pytest.approx(float(cos.max()), abs=1e-6)


@pytest.mark.parametrize("max_factor", [0.0, -1.0, math.inf, math.nan])
def test_zip_factor_cap_must_be_finite_and_positive(max_factor):
    """A cap outside (0, inf) would let a ZIP key factor of 0 or inf through the guard."""
    with pytest.raises(ValueError, match="max_factor must be finite and > 0"):
        KeepKV(max_factor=max_factor)
