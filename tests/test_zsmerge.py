"""ZSMerge against the paper's equations, driven directly on a CompressedLayer with random tensors.

Values are one-hot vectors of the token index, so every slot's value tells which original tokens
it holds and with what weight: a merged slot must be the plain mean of its members (Eq. 7).
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import decode_attention
from methods import CompressedLayer, ZSMerge
from methods.seam.step import prefill_step

B, H, HQ, D = 2, 2, 6, 8


def drive(method: ZSMerge, budget: int | None, prompt: int, steps: int, seed: int = 0, check=None):
    """Prefill ``prompt`` random tokens then ``steps`` decode steps; values are one-hot token ids."""
    gen = torch.Generator().manual_seed(seed)
    total = prompt + steps
    keys = torch.randn(B, H, total, D, generator=gen, dtype=torch.float64)
    values = torch.eye(total, dtype=torch.float64).expand(B, H, total, total).clone()
    layer = CompressedLayer(method.traits.state_fill, budget)
    layer.update(keys[:, :, :prompt], values[:, :, :prompt])
    scale = D**-0.5
    prefill_step(
        method, layer, torch.randn(B, HQ, prompt, D, generator=gen, dtype=torch.float64), None, None, scale
    )
    if check:
        check(layer)
    for t in range(prompt, total):
        layer.update(keys[:, :, t : t + 1], values[:, :, t : t + 1])
        q = torch.randn(B, HQ, 1, D, generator=gen, dtype=torch.float64)
        _, probs = decode_attention(q, layer.keys, layer.values, layer.store.log_weight, scale)
        method.decode_step(layer, probs)
        if check:
            check(layer)
    return layer, keys


def members(layer: CompressedLayer, b: int, h: int, slot: int) -> list[int]:
    return torch.nonzero(layer.values[b, h, slot] > 0).flatten().tolist()


@pytest.mark.parametrize(
    ("budget", "expected"), [(20, (10, 9, 1)), (100, (50, 49, 1)), (400, (200, 196, 4)), (8, (4, 3, 1))]
)
def test_tripartite_split_follows_appendix_c2(budget, expected):
    assert ZSMerge().split(budget) == expected


def test_split_overrides_and_errors():
    assert ZSMerge(residual_ratio=2).split(20) == (10, 8, 2)  # Table 2's stated B_r = 2
    assert ZSMerge(residual_ratio=0).split(20) == (10, 10, 0)
    assert ZSMerge(proximity_ratio=4).split(20) == (4, 15, 1)
    with pytest.raises(ValueError, match="no context slot"):
        ZSMerge().split(2)


@pytest.mark.parametrize("field", [{"alpha": 1.5}, {"lam": -0.1}, {"window_size": 0}, {"order": "x"}])
def test_bad_hyperparameters_raise(field):
    with pytest.raises(ValueError):
        ZSMerge(**field)


@pytest.mark.parametrize("order", ["code", "paper"])
@pytest.mark.parametrize(
    ("budget", "prompt", "residual"), [(12, 40, 0.02), (12, 40, 3), (30, 20, 2), (16, 40, 0)]
)
def test_invariants_at_every_step(order, budget, prompt, residual):
    """Budget never exceeded, proximity window intact, memory really freed, nothing lost (B_r > 0)."""
    method = ZSMerge(order=order, residual_ratio=residual)
    b_p, _, b_r = method.split(budget)

    def check(layer: CompressedLayer) -> None:
        n = layer.store.n_slots
        assert n <= budget
        assert layer.scalars["residual"] <= b_r
        bytes_per_slot = B * H * (D + layer.values.shape[-1]) * 8
        assert layer.store.kv_bytes() == n * bytes_per_slot  # storage holds exactly the kept slots
        newest = layer.get_seq_length() - 1
        for b in range(B):
            for h in range(H):
                present = set(layer.store.positions[b, h].tolist())
                assert set(range(newest - b_p + 1, newest + 1)) <= present

    layer, _ = drive(method, budget, prompt, steps=25, check=check)
    assert layer.store.n_slots == budget
    fusion = layer.store.state["fusion"]
    if b_r:
        # Every token ever seen is still represented: fusion counts add up to the tokens seen.
        torch.testing.assert_close(fusion.sum(-1), torch.full((B, H), float(layer.get_seq_length())))
    else:
        assert torch.all(fusion == 1)


@pytest.mark.parametrize("order", ["code", "paper"])
def test_merged_slots_are_means_of_their_originals(order):
    """Eq. 7: a residual slot's key and value are the plain means over the tokens merged into it."""
    method = ZSMerge(order=order, residual_ratio=3)
    layer, keys = drive(method, budget=14, prompt=50, steps=30)
    for b in range(B):
        for h in range(H):
            seen: list[int] = []
            for slot in range(layer.store.n_slots):
                ids = members(layer, b, h, slot)
                seen += ids
                w = layer.store.state["fusion"][b, h, slot].item()
                assert len(ids) == w
                torch.testing.assert_close(
                    layer.values[b, h, slot, ids], torch.full((len(ids),), 1 / w, dtype=torch.float64)
                )
                torch.testing.assert_close(layer.keys[b, h, slot], keys[b, h, ids].mean(0))
                assert layer.store.log_weight[b, h, slot].item() == pytest.approx(method.alpha * math.log(w))
            assert sorted(seen) == list(range(layer.get_seq_length()))


def naive_window_scores(query, keys, window, lam, kernel):
    """Literal App. B initialisation for one (b, kv head): lam-weighted window attention, max-pooled."""
    length, group = keys.shape[0], query.shape[0]
    s = torch.zeros(length, dtype=torch.float64)
    for i in range(window):
        p = length - window + i
        for g in range(group):
            logits = [float(query[g, p] @ keys[t]) * D**-0.5 for t in range(p + 1)]
            m = max(logits)
            z = sum(math.exp(x - m) for x in logits)
            for t in range(p + 1):
                s[t] += lam ** (window - 1 - i) * math.exp(logits[t] - m) / z / group
    return torch.tensor([s[max(0, t - kernel // 2) : t + kernel // 2 + 1].max() for t in range(length)])


def test_prefill_keeps_proximity_plus_top_context_and_groups_the_rest():
    method = ZSMerge(residual_ratio=3)
    prompt, budget = 40, 16
    b_p, b_c, b_r = method.split(budget)
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(B, H, prompt, D, generator=gen, dtype=torch.float64)
    values = torch.eye(prompt, dtype=torch.float64).expand(B, H, prompt, prompt).clone()
    query = torch.randn(B, HQ, prompt, D, generator=gen, dtype=torch.float64)
    layer = CompressedLayer(method.traits.state_fill, budget)
    layer.update(keys, values)
    prefill_step(method, layer, query, None, None, D**-0.5)
    g = HQ // H
    for b in range(B):
        for h in range(H):
            s = naive_window_scores(query[b, h * g : (h + 1) * g], keys[b, h], 8, method.lam, 5)
            older = prompt - b_p
            top = set(torch.topk(s[:older], b_c).indices.tolist())
            kept = [p for p in layer.store.positions[b, h].tolist() if p >= 0]
            assert set(kept) == top | set(range(older, prompt))
            leftover = sorted(set(range(older)) - top)
            groups = [members(layer, b, h, slot) for slot in range(b_r)]
            assert [i for grp in groups for i in grp] == leftover  # contiguous groups, in position order
            sizes = [len(x) for x in groups]
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("order", ["code", "paper"])
def test_decode_step_updates_scores_by_eq5_and_evicts_the_lowest(order):
    method = ZSMerge(order=order, residual_ratio=2)
    budget, prompt = 12, 30
    layer, _ = drive(method, budget, prompt, steps=4, seed=5)
    b_p, _, _ = method.split(budget)
    gen = torch.Generator().manual_seed(9)
    k = torch.randn(B, H, 1, D, generator=gen, dtype=torch.float64)
    v = torch.zeros(B, H, 1, layer.values.shape[-1], dtype=torch.float64)
    layer.update(k, v)
    q = torch.randn(B, HQ, 1, D, generator=gen, dtype=torch.float64)
    _, probs = decode_attention(q, layer.keys, layer.values, layer.store.log_weight, D**-0.5)
    positions = layer.store.positions.clone()
    expected = method.lam * layer.store.state["scores"] + probs  # Eq. 5
    leaving = layer.get_seq_length() - 1 - b_p
    method.decode_step(layer, probs)
    for b in range(B):
        for h in range(H):
            before = positions[b, h].tolist()
            score_of = {p: expected[b, h, slot].item() for slot, p in enumerate(before) if p >= 0}
            cand = {p: s for p, s in score_of.items() if (p <= leaving if order == "paper" else p < leaving)}
            victim = min(cand, key=cand.get)
            after = layer.store.positions[b, h].tolist()
            assert set(before) - {-1} - set(after) == {victim}
            for slot, p in enumerate(after):
                if p >= 0:
                    assert layer.store.state["scores"][b, h, slot].item() == pytest.approx(score_of[p])


def test_code_order_spares_the_token_leaving_the_window_and_paper_order_does_not():
    budget, prompt = 10, 10
    for order, spared in (("code", True), ("paper", False)):
        method = ZSMerge(order=order, residual_ratio=0, lam=1.0)
        layer = CompressedLayer(method.traits.state_fill, budget)
        layer.update(torch.randn(1, 1, prompt, D), torch.randn(1, 1, prompt, D))
        prefill_step(method, layer, torch.randn(1, 1, prompt, D), None, None, D**-0.5)
        b_p, _, _ = method.split(budget)
        leaving = prompt - b_p  # leaves the proximity window when token `prompt` arrives
        layer.store.state["scores"].fill_(1.0)
        layer.store.state["scores"][..., leaving] = 0.0  # the lowest score
        layer.update(torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D))
        method.decode_step(layer, torch.zeros(1, 1, prompt + 1))
        assert (leaving in layer.store.positions[0, 0].tolist()) is spared


def test_alpha_zero_has_no_compensation():
    layer, _ = drive(ZSMerge(alpha=0.0, residual_ratio=2), budget=12, prompt=30, steps=10)
    assert torch.all(layer.store.state["fusion"][..., :2] > 1)
    assert torch.all(layer.store.log_weight == 0)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_theorem1_uncompressed_tokens_never_lose_attention(alpha):
    """Theorem 1: with merged slots compensated by alpha*log(w), alpha <= 1, a_hat_i >= a_i."""
    gen = torch.Generator().manual_seed(int(alpha * 10))
    for _ in range(20):
        t, d = 40, 16
        k = torch.randn(1, 1, t, d, generator=gen, dtype=torch.float64) * 2
        v = torch.randn(1, 1, t, d, generator=gen, dtype=torch.float64)
        q = torch.randn(1, 1, 1, d, generator=gen, dtype=torch.float64) * 2
        perm = torch.randperm(t, generator=gen)
        kept, merged = perm[:20].sort().values, perm[20:]
        groups = [merged[i::3] for i in range(3)]
        comp_k = torch.cat([k[:, :, kept]] + [k[:, :, g].mean(2, keepdim=True) for g in groups], 2)
        comp_v = torch.cat([v[:, :, kept]] + [v[:, :, g].mean(2, keepdim=True) for g in groups], 2)
        w = torch.tensor([1.0] * 20 + [float(len(g)) for g in groups])
        _, full = decode_attention(q, k, v, None, d**-0.5)
        _, comp = decode_attention(q, comp_k, comp_v, (alpha * w.log())[None, None], d**-0.5)
        assert torch.all(comp[0, 0, :20] >= full[0, 0, kept] - 1e-7)


def test_all_query_initialisation_is_the_decayed_sum_over_every_prompt_query():
    """ZeroMerge code (XSum preset): s_t = sum_i lam^(L-1-i) a_i(t) over all prompt queries."""
    method = ZSMerge(window_size=None, pool_kernel=1, lam=0.9)
    prompt = 12
    gen = torch.Generator().manual_seed(11)
    keys = torch.randn(1, 1, prompt, D, generator=gen, dtype=torch.float64)
    query = torch.randn(1, 1, prompt, D, generator=gen, dtype=torch.float64)
    layer = CompressedLayer(method.traits.state_fill, None)
    layer.update(keys, keys)
    prefill_step(method, layer, query, None, None, D**-0.5)
    expected = torch.zeros(prompt, dtype=torch.float64)
    for i in range(prompt):
        logits = (keys[0, 0, : i + 1] @ query[0, 0, i]) * D**-0.5
        expected[: i + 1] += 0.9 ** (prompt - 1 - i) * torch.softmax(logits, 0)
    torch.testing.assert_close(layer.store.state["scores"][0, 0].double(), expected, rtol=1e-5, atol=1e-6)
