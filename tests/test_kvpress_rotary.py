"""LeverageScore, CurDKV and KeyRerotation, the presses that read the pre-RoPE keys, against references
written here from each rule (kvpress's press): explicit inverses, block sums, re-rotated keys."""

from __future__ import annotations

import pytest
import torch

from methods import AdaKV, CurDKV, KeyRerotation, KNorm, LeverageScore
from tests.press_fixtures import HKV, D, kept, prefilled, rope, rotary_spec, tensors


def leverage_kept(pre: torch.Tensor, phi: torch.Tensor, budget: int) -> list[list[int]]:
    """Per KV head, the top ``budget`` leverage scores ``diag(X (X^T X + 1e-2 I)^-1 X^T)`` of the centred
    pre-RoPE keys ``pre`` ``[1, HKV, n, D]`` sketched by ``phi`` ``[HKV, D, s]`` (explicit inverse,
    float64)."""
    want = []
    for h in range(HKV):
        x = (pre[0, h] - pre[0, h].mean(0)).double() @ phi[h].double()
        lev = torch.diag(x @ torch.linalg.inv(x.T @ x + 1e-2 * torch.eye(phi.shape[-1])) @ x.T)
        want.append(sorted(lev.topk(budget).indices.tolist()))
    return want


@pytest.mark.parametrize("sketch", [4, 48])
def test_leverage_score_keeps_the_highest_leverage_of_the_pre_rope_keys(sketch):
    """kvpress ``LeverageScorePress`` (Chari & Van Durme 2025): the pre-RoPE keys centred over the
    sequence, sketched ``X = (K - mean) Phi``, leverage ``diag(X (X^T X + 1e-2 I)^-1 X^T)`` (an explicit
    inverse here, in float64), z-scored; the top ``budget`` kept. The layer holds post-RoPE keys."""
    n, budget = 30, 12
    pre, values, query = tensors(n, seed=3)
    spec, emb = rotary_spec()
    method = LeverageScore(sketch_dimension=sketch, seed=7)
    layer = prefilled(method, rope(pre, torch.arange(n), emb), values, query, budget, spec)
    phi = method.sketch(layer, HKV, D, pre.device).double()
    want = leverage_kept(pre, phi, budget)
    assert kept(layer) == want


def test_leverage_score_without_a_seed_draws_kvpress_sketch_from_the_global_generator():
    """``seed=None``: the sketch is ``torch.randn(1, kv_heads, head_dim, s) / sqrt(s)`` from torch's global
    generator at prefill, kvpress's draw: seeded alike, the kept sets are those of that very sketch
    (and not those of the seeded default)."""
    n, budget, sketch = 30, 12, 4
    pre, values, query = tensors(n, seed=3)
    spec, emb = rotary_spec()
    torch.manual_seed(11)
    layer = prefilled(LeverageScore(sketch_dimension=sketch, seed=None), rope(pre, torch.arange(n), emb),
                      values, query, budget, spec)  # fmt: skip
    torch.manual_seed(11)
    phi = (torch.randn(1, HKV, D, sketch) / sketch**0.5)[0].double()  # kvpress's draw
    want = leverage_kept(pre, phi, budget)
    assert kept(layer) == want
    seeded = prefilled(LeverageScore(sketch_dimension=sketch), rope(pre, torch.arange(n), emb),
                       values, query, budget, spec)  # fmt: skip
    assert kept(seeded) != want


@pytest.mark.parametrize(("n", "leverage_type"), [(45, "kv_product"), (48, "kv_avg")])
def test_cur_keeps_the_sinks_and_the_best_block_normalised_norms(n, leverage_type):
    """CurDKV (arXiv 2509.15038; kvpress ``CURPress``): per head, ``||k||^2`` and ``||v||^2`` each divided
    by their sum over blocks of 16 tokens from token 0 (a shorter last block at n = 45), combined, the
    first 4 tokens kept, then the best scores; post-RoPE keys (their norms are the pre-RoPE ones)."""
    budget = 14
    pre, values, query = tensors(n, seed=5)
    spec, emb = rotary_spec()
    layer = prefilled(
        CurDKV(leverage_type=leverage_type), rope(pre, torch.arange(n), emb), values, query, budget, spec
    )
    want = []
    for h in range(HKV):
        k2, v2 = pre[0, h].double().square().sum(-1), values[0, h].double().square().sum(-1)
        for x in (k2, v2):
            for s in range(0, n, 16):
                x[s : s + 16] /= x[s : s + 16].sum().clone()
        score = k2 * v2 if leverage_type == "kv_product" else (k2 + v2) / 2
        score[:4] = float("inf")
        want.append(sorted(score.topk(budget).indices.tolist()))
    assert kept(layer) == want


@pytest.mark.parametrize("wrapped", [KNorm(), AdaKV(scorer=KNorm())], ids=["knorm", "adakv_knorm"])
def test_key_rerotation_turns_the_kept_keys_to_contiguous_positions(wrapped):
    """kvpress ``KeyRerotationPress``: the wrapped method's tokens, their keys re-rotated to contiguous
    positions. KVBench's new tokens keep their true positions, so each head's ``k`` kept keys sit at
    ``n - k .. n - 1`` (every distance to a later query is kvpress's): ``RoPE(k_pre, n - k + rank)``."""
    n, budget = 40, 10
    pre, values, query = tensors(n, seed=5)
    spec, emb = rotary_spec()
    post = rope(pre, torch.arange(n), emb)
    alone = kept(prefilled(wrapped, post, values, query, budget, spec))
    layer = prefilled(KeyRerotation(scorer=wrapped), post, values, query, budget, spec)
    assert kept(layer) == alone
    for h in range(HKV):
        pos = layer.store.positions[0, h]
        slots = [s for s in pos.argsort().tolist() if pos[s] >= 0]
        k = len(slots)
        want = rope(pre[0, h, alone[h]], torch.arange(n - k, n), emb)
        torch.testing.assert_close(layer.keys[0, h, slots], want, atol=1e-5, rtol=1e-5)
