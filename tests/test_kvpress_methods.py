"""ObservedAttention, ChunkKV, DMS, PyramidKV, SimLayerKV and LagKV against references written here from
each rule (the paper's, or kvpress's press where the method is kvpress's; the presses that read pre-RoPE
keys: test_kvpress_rotary.py).

Each test prefills one layer of tiny random tensors (2 KV heads, 3 query heads each) and compares
the positions each head keeps with a straightforward implementation of the rule: full attention
matrices, loops over chunks.
"""

from __future__ import annotations

import pytest
import torch

from methods import (
    DMS,
    ChunkKV,
    KNorm,
    LagKV,
    ObservedAttention,
    SimLayerKV,
)
from tests.press_fixtures import GROUP, HKV, attention, kept, prefilled, tensors


@pytest.mark.parametrize("budget", [7, 20])
def test_observed_attention_keeps_the_highest_mean_attention_received(budget):
    """kvpress ``ObservedAttentionPress``: column sums over the ``n - j`` queries that see token j,
    divided by that count, averaged over the group's query heads; the top ``budget`` kept."""
    n = 40
    keys, values, query = tensors(n)
    layer = prefilled(ObservedAttention(chunk_size=7), keys, values, query, budget)
    a = attention(keys, query)
    score = (a.sum(1) / torch.arange(n, 0, -1)).view(HKV, GROUP, n).mean(1)
    assert kept(layer) == [sorted(score[h].topk(budget).indices.tolist()) for h in range(HKV)]


@pytest.mark.parametrize(("n", "budget"), [(60, 20), (62, 23)])
def test_chunkkv_keeps_the_chunks_of_the_best_summed_scores(n, budget):
    """ChunkKV (Liu et al. 2025, kvpress ``ChunkKVPress``) over KNorm: chunks of 5 from token 0, a
    chunk's score the mean over its tokens of ``-||k||`` summed over the KV heads; the best chunks
    kept whole in every head, then (a budget that is no multiple of 5) the best tokens of the next."""
    keys, values, query = tensors(n, seed=1)
    layer = prefilled(ChunkKV(scorer=KNorm(), chunk_length=5), keys, values, query, budget)
    token = -keys[0].norm(dim=-1).sum(0)  # [n]
    chunks = [list(range(s, min(s + 5, n))) for s in range(0, n, 5)]
    ranked = sorted(chunks, key=lambda c: -token[c].mean().item())
    want: list[int] = []
    for c in ranked:
        room = budget - len(want)
        want += c if len(c) <= room else sorted(c, key=lambda j: -token[j].item())[:room]
    assert kept(layer) == [sorted(want)] * HKV


@pytest.mark.parametrize(("n", "share"), [(62, 0.5), (63, 0.3), (3, 0.5)])
def test_chunkkv_kvpress_keeps_whole_chunks_by_the_shares_count(n, share):
    """``whole_chunks=true`` (preset ``chunkkv_kvpress``, kvpress ``ChunkKVPress``) over KNorm: chunks
    of 5 from token 0 (the last partial), the top ``max(1, int(chunks x share))`` by the mean of the
    head-summed scores kept whole in every head, however many tokens that is; the share is the one
    the budget was floored from (a prompt shorter than a chunk: the scorer's own top budget)."""
    from methods.seam.plan import Slots

    keys, values, query = tensors(n, seed=1)
    budget = Slots(max(1, int(n * share)), share)
    layer = prefilled(ChunkKV(scorer=KNorm(), chunk_length=5, whole_chunks=True), keys, values, query, budget)
    token = -keys[0].norm(dim=-1).sum(0)  # [n]
    if n < 5:
        norms = -keys[0].norm(dim=-1)
        assert kept(layer) == [sorted(norms[h].topk(budget).indices.tolist()) for h in range(HKV)]
        return
    chunks = [list(range(s, min(s + 5, n))) for s in range(0, n, 5)]
    ranked = sorted(chunks, key=lambda c: -token[c].mean().item())
    want = sorted(j for c in ranked[: max(1, int(len(chunks) * share))] for j in c)
    assert kept(layer) == [want] * HKV
    assert n != 62 or len(want) != budget  # whole chunks, not the budget: 30 tokens for 31 slots


def lagkv_kvpress_kept(keys: torch.Tensor, values: torch.Tensor, n_sink: int, lag: int, budget: int):
    """kvpress ``LagKVPress`` + ``ScorerPress.compress``, re-stated per head with loops: partition ``m``
    min-max normalised by ``m + 1``'s per-channel range, ``(softmax(std K) + softmax(std V)) / 2``
    ranked inside its partition by ``torch.argsort`` (unstable: kvpress's order of exact ties), score
    ``rank / lag``; sinks and the unscored tail 1; kept: ``torch.topk`` of that vector (its tie order
    is kvpress's)."""
    n, out = keys.shape[2], []
    parts = (n - n_sink) // lag
    for h in range(HKV):
        vector = [1.0] * n
        for m in range(parts - 1):
            total = 0
            for x in (keys[0, h], values[0, h]):
                part = x[n_sink + m * lag : n_sink + (m + 1) * lag]
                ref = x[n_sink + (m + 1) * lag : n_sink + (m + 2) * lag]
                low, high = ref.min(0).values, ref.max(0).values
                std = torch.stack([((t - low) / (high - low)).std() for t in part])
                total = total + torch.softmax(std, 0) / 2
            for rank, i in enumerate(total.argsort().tolist()):
                vector[n_sink + m * lag + i] = rank / lag
        out.append(sorted(torch.tensor(vector).topk(budget).indices.tolist()))
    return out


@pytest.mark.parametrize("budget", [10, 31])
def test_lagkv_kvpress_breaks_ties_as_kvpress_topk(budget):
    """``ties="topk"`` (preset ``lagkv_kvpress``): kvpress's kept sets where rank ties between
    partitions (budget 31: 4 of the 6 rank-5 tokens) or sinks and tail (budget 10 of 15) split, and
    where the default (the newer partition, the sinks first) keeps others."""
    keys, values, query = tensors(63)  # 4 sinks, 7 partitions of 8, 3 more: 6 partitions scored
    want = lagkv_kvpress_kept(keys, values, 4, 8, budget)
    assert kept(prefilled(LagKV(lag_size=8, ties="topk"), keys, values, query, budget)) == want
    assert kept(prefilled(LagKV(lag_size=8), keys, values, query, budget)) != want


def test_lagkv_kvpress_ranks_exact_ties_as_kvpress_argsort():
    """``ties="topk"``: two tokens of one partition with the same key and value rows (bit-identical
    scores) ranked in the order of kvpress's unstable ``argsort`` (a partition of 32: on the CPU not the
    older first), at every budget; the stable order (the default) differs at some."""
    keys, values, query = tensors(105)  # 4 sinks, 3 partitions of 32, 5 more: 2 partitions scored
    keys[:, :, 20], values[:, :, 20] = keys[:, :, 5], values[:, :, 5]  # argsort: 20 first (each head)
    budgets = range(41, 106)  # sinks + tail 41 .. all
    want = [lagkv_kvpress_kept(keys, values, 4, 32, b) for b in budgets]
    assert [kept(prefilled(LagKV(lag_size=32, ties="topk"), keys, values, query, b)) for b in budgets] == want
    assert [kept(prefilled(LagKV(lag_size=32), keys, values, query, b)) for b in budgets] != want


def test_pyramidkv_kvpress_budgets_share_the_whole_budget():
    """``window_in_budget=true`` (preset ``pyramidkv_kvpress``), kvpress ``PyramidKVPress``: with ``s``
    the tokens a uniform layer keeps, the top layer keeps ``s / beta`` tokens window included, the
    layers' mean is ``s`` (up to rounding), ``max`` capped at ``prompt - window`` raising ``min``, and
    a minimum under the window falls back to ``round(s)`` in every layer."""
    from methods.pyramidkv import kvpress_budgets

    budgets = kvpress_budgets(2000.0, 64, 4000, 30, 20)
    assert budgets[-1] == 100 and budgets[0] == 3900 and budgets == sorted(budgets, reverse=True)
    assert abs(sum(budgets) / 30 - 2000) < 1
    assert kvpress_budgets(100.0, 64, 200, 2, 20) == [136, 64]  # capped: 200 - 64, min raised to 64
    assert kvpress_budgets(1000.0, 64, 4000, 30, 20) == [1000] * 30  # min 50 < 64: SnapKV's round(s)


def test_dms_evicts_what_scores_below_the_threshold_outside_the_window():
    """kvpress ``DMSPress`` over KNorm: per head, a token older than the ``sliding_window_size``
    newest is evicted when ``-||k||`` is below the threshold; the heads keep different counts, and
    the layer holds exactly what they keep (no padding to the largest head)."""
    n, window = 50, 8
    keys, values, query = tensors(n, seed=2)
    threshold = float(-keys.norm(dim=-1).median())
    method = DMS(scorer=KNorm(), threshold=threshold, sliding_window_size=window)
    layer = prefilled(method, keys, values, query, 10)
    want = [
        [j for j in range(n) if j >= n - window or -keys[0, h, j].norm() >= threshold] for h in range(HKV)
    ]
    assert len(want[0]) != len(want[1]) and kept(layer) == want
    assert layer.store.head_slots()[0].tolist() == [len(w) for w in want]


@pytest.mark.parametrize("lazy", [True, False])
def test_simlayerkv_lazy_layer_keeps_sinks_and_recent_tokens(lazy):
    """SimLayerKV (Zhang et al. 2024; kvpress ``SimLayerKVPress``, ``n_last`` 1): the last query's
    attention (softmax over every key), averaged over the query heads, summed over the ``n_initial``
    sinks and the ``n_recent`` tokens before the query; above the threshold the layer keeps the sinks
    and the last ``n_recent - 1`` tokens, else everything. Thresholds just below and above the sum."""
    n, n_initial, n_recent = 50, 2, 10
    keys, values, query = tensors(n, seed=4)
    last = attention(keys, query)[:, -1].mean(0)
    score = float(last[:n_initial].sum() + last[n - 1 - n_recent : n - 1].sum())
    threshold = score - 1e-4 if lazy else score + 1e-4
    method = SimLayerKV(lazy_threshold=threshold, n_recent=n_recent, n_initial=n_initial)
    layer = prefilled(method, keys, values, query, None)
    window = list(range(n_initial)) + list(range(n - n_recent + 1, n))
    assert kept(layer) == [window if lazy else list(range(n))] * HKV
    assert int(layer.scalars.get("lazy_layers", torch.zeros(1)).sum()) == int(lazy)
