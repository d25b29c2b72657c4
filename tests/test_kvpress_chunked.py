"""Block, Chunk, EntropyGatedChunkKV and Finch (kvpress's ``BlockPress``, ``ChunkPress``,
``EntropyGatedChunkKVPress``, ``FinchPress``) against references written here from kvpress's rule, in
the style of ``tests/test_kvpress_methods.py`` (one layer of tiny random tensors, plain loops; helpers:
``tests/press_fixtures.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from methods import METHOD_REGISTRY as M
from tests.press_fixtures import GROUP, HKV, attention, kept, prefilled, tensors


def keydiff(keys: torch.Tensor) -> torch.Tensor:
    """``-cos(k_i, mean_j k_j / ||k_j||)`` of one head's keys ``[m, D]``."""
    anchor = (keys / keys.norm(dim=-1, keepdim=True)).mean(0)
    return -(keys @ anchor) / (keys.norm(dim=-1) * anchor.norm())


@pytest.mark.parametrize(("n", "budget", "block"), [(50, 12, 7), (40, 30, 128)])
def test_block_rescores_the_kept_tokens_with_each_block(n, budget, block):
    """kvpress ``BlockPress(KeyDiffPress())``: per head, the first ``budget`` tokens; each block of
    ``block`` tokens after them joins the survivors and KeyDiff, over those tokens alone (their own
    anchor), keeps the top ``budget``."""
    keys, values, query = tensors(n, seed=2)
    layer = prefilled(M["block"](block_size=block), keys, values, query, budget)
    want = []
    for h in range(HKV):
        survivors = list(range(budget))
        for start in range(budget, n, min(block, n)):
            cand = survivors + list(range(start, min(start + block, n)))
            score = keydiff(keys[0, h, cand])
            survivors = [cand[i] for i in score.topk(budget).indices.tolist()]
        want.append(sorted(survivors))
    assert kept(layer) == want


@pytest.mark.parametrize(("n", "share"), [(23, 0.3), (40, 0.5)])
def test_chunk_compresses_each_chunk_alone_by_the_share(n, share):
    """kvpress ``ChunkPress(KeyDiffPress())``: chunks of 5 from token 0; per head, KeyDiff over one
    chunk alone (its own anchor) keeps ``max(1, int(c x share))`` of its ``c`` tokens."""
    from methods.seam.plan import Slots

    keys, values, query = tensors(n, seed=3)
    method = M["chunk"](scorer=M["keydiff"](), chunk_length=5)
    layer = prefilled(method, keys, values, query, Slots(max(1, int(n * share)), share))
    want = []
    for h in range(HKV):
        head = []
        for s in range(0, n, 5):
            c = list(range(s, min(s + 5, n)))
            head += [c[i] for i in keydiff(keys[0, h, c]).topk(max(1, int(len(c) * share))).indices.tolist()]
        want.append(sorted(head))
    assert kept(layer) == want


def entropy(xs: list[float]) -> float:
    """Normalised entropy of one chunk's scores, shifted to be non-negative (kvpress's epsilon 1e-8)."""
    if len(xs) == 1:
        return 0.0
    low = min(min(xs), 0.0)
    ys = [x - low for x in xs]
    p = [y / (sum(ys) + 1e-8) for y in ys]
    return min(max(-sum(q * math.log(q + 1e-8) for q in p) / math.log(len(xs)), 0.0), 1.0)


@pytest.mark.parametrize(("n", "budget"), [(47, 20), (60, 13)])
def test_entropy_gated_chunkkv_trims_spiky_high_chunks_and_tops_up(n, budget):
    """kvpress ``EntropyGatedChunkKVPress`` over KNorm: head-summed ``-||k||``, chunks of 6 from token
    0; by mean score, best first, while budget lasts: a chunk at or above the (lower) median mean
    with entropy below the (lower) median entropy keeps its best 2, any other all it can (its best
    tokens when the budget is short); the rest of the budget goes to the best tokens left."""
    keys, values, query = tensors(n, seed=4)
    method = M["entropy_gated_chunkkv"](scorer=M["knorm"](), chunk_length=6, low_entropy_chunk_length=2)
    layer = prefilled(method, keys, values, query, budget)
    token = (-keys[0].norm(dim=-1).sum(0)).tolist()
    chunks = [list(range(s, min(s + 6, n))) for s in range(0, n, 6)]
    means = [sum(token[j] for j in c) / len(c) for c in chunks]
    ents = [entropy([token[j] for j in c]) for c in chunks]
    mid_mean, mid_ent = sorted(means)[(len(chunks) - 1) // 2], sorted(ents)[(len(chunks) - 1) // 2]
    want, left = set(), budget
    for i in sorted(range(len(chunks)), key=lambda i: -means[i]):
        if left <= 0:
            break
        k = min(len(chunks[i]), left)
        if means[i] >= mid_mean and ents[i] < mid_ent:
            k = min(k, 2)
        want |= set(sorted(chunks[i], key=lambda j: -token[j])[:k])
        left -= k
    want |= set(sorted(set(range(n)) - want, key=lambda j: -token[j])[:left])
    assert kept(layer) == [sorted(want)] * HKV
    assert len(want) == budget


@pytest.mark.parametrize(("chunk", "window"), [(None, 6), (16, 6), (None, None)])
def test_finch_keeps_the_question_and_the_context_it_attends_to(chunk, window):
    """kvpress ``FinchPress`` (window: the last 6 tokens, the question): question query ``i``'s causal
    attention on the context times ``n - 6 + i``, averaged over the question and the group's query
    heads; the question kept with the context's top; with ``chunk_length`` 16, each chunk keeps its
    ``max(1, int(c / 2))`` best, the question above every context token. ``window_size=None``: the
    question's length the run gives with the budget (``Slots.question``)."""
    from methods.seam.plan import Slots

    n, w = 44, 6  # chunks of 16: 8, 8 and 6 (the question) kept
    keys, values, query = tensors(n, seed=5)
    budget = Slots(n // 2, 0.5, question=w)
    layer = prefilled(M["finch"](window_size=window, chunk_length=chunk), keys, values, query, budget)
    a = attention(keys, query)[:, n - w :, : n - w]  # [q_heads, w, context]
    score = (a * torch.arange(n - w, n)[None, :, None]).mean(1).view(HKV, GROUP, n - w).mean(1)
    score = torch.cat([score, torch.full((HKV, w), score.max().item() + 1)], dim=1)
    spans = [(0, n)] if chunk is None else [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
    want = [
        sorted(j for s, e in spans for j in (s + score[h, s:e].topk(max(1, (e - s) // 2)).indices).tolist())
        for h in range(HKV)
    ]
    assert kept(layer) == want
    assert all(set(range(n - w, n)) <= set(k) for k in want)


def test_query_aware_budgets_carry_the_question_length_finch_reads(data_dir, tokenizer):
    """kvpress runs FinchPress query-aware only (its window: the question at the end of what it
    compresses). A query-aware run's budgets carry each prompt's question length (from
    ``Task.question_start`` to the end of compression); a query-agnostic run's, where the question is
    appended after compression, carry none."""
    from types import SimpleNamespace

    from runners.quality import check_budgets, question_starts, question_tokens
    from tasks.longbench import LongBench

    settings = SimpleNamespace(model=SimpleNamespace(max_context=8192), budget_unit="prompt")
    for aware in (True, False):
        task = LongBench(data_dir=str(data_dir), subsets="local", limit=1, query_aware=aware)
        samples = task.load()
        prompts = [task.encode(tokenizer, s) for s in samples]
        starts = question_starts(tokenizer, task, samples, prompts)
        questions = question_tokens(tokenizer, task, samples, prompts, starts)
        budgets = check_budgets(settings, M["finch"](), 0.5, samples, prompts, task, starts, questions)
        for s, p, b in zip(samples, prompts, budgets, strict=True):
            want = p.shape[1] - task.question_start(tokenizer, s, p) if aware else None
            assert b.question == want and b.share == 0.5
            assert want is None or 0 < want < p.shape[1] // 4  # the question, not the context
