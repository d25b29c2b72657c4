"""H2O, SnapKV and StreamingLLM against slow, literal re-implementations of their papers' rules."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kernels import decode_attention
from methods import H2O, CompressedLayer, SnapKV, StreamingLLM
from methods.scoring import causal_column_sums
from methods.seam.architecture import LayerSpec
from methods.seam.rope import LayerRotary
from methods.seam.step import prefill_step
from tests.conftest import tiny_llama

B, H, HQ, D = 2, 2, 6, 8
SCALE = D**-0.5


def random_prompt(length: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, length, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, length, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, length, D, generator=gen, dtype=torch.float64)
    return q, k, v, gen


def naive_attention_matrix(q, k):
    """Full causal attention ``[batch, kv_heads, prompt, prompt]``, averaged over each group."""
    g = HQ // H
    logits = torch.einsum("bhqd,bhkd->bhqk", q, k.repeat_interleave(g, dim=1)) * SCALE
    length = q.shape[2]
    mask = torch.ones(length, length, dtype=torch.bool).triu(1)
    probs = torch.softmax(logits.masked_fill(mask, float("-inf")), dim=-1)
    return probs.view(B, H, g, length, length).mean(2)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_column_sums_equal_the_full_matrix(chunk):
    q, k, _, _ = random_prompt(37, 0)
    expected = naive_attention_matrix(q, k).sum(dim=2)
    torch.testing.assert_close(
        causal_column_sums(q, k, SCALE, chunk).double(), expected, rtol=1e-5, atol=1e-6
    )


def test_h2o_keeps_heavy_hitters_of_the_full_matrix_then_evicts_the_lowest_each_step():
    length, budget, steps = 40, 12, 15
    method = H2O()
    heavy, recent = method.split(budget)
    q, k, v, gen = random_prompt(length, 1)
    layer = CompressedLayer(method.traits.state_fill, budget)
    layer.update(k, v)
    prefill_step(method, layer, q, None, None, SCALE)
    acc = naive_attention_matrix(q, k).sum(dim=2)
    for b in range(B):
        for h in range(H):
            top = set(torch.topk(acc[b, h, : length - recent], heavy).indices.tolist())
            assert set(layer.store.positions[b, h].tolist()) == top | set(range(length - recent, length))
    # literal decode: a dict {position: accumulated score} per head
    kept = [
        [{p: acc[b, h, p].item() for p in layer.store.positions[b, h].tolist()} for h in range(H)]
        for b in range(B)
    ]
    for t in range(length, length + steps):
        layer.update(
            torch.randn(B, H, 1, D, generator=gen, dtype=torch.float64),
            torch.zeros(B, H, 1, D, dtype=torch.float64),
        )
        _, probs = decode_attention(
            torch.randn(B, HQ, 1, D, generator=gen, dtype=torch.float64),
            layer.keys,
            layer.values,
            None,
            SCALE,
        )
        for b in range(B):
            for h in range(H):
                scores = kept[b][h]
                scores[t] = 0.0
                for slot, p in enumerate(layer.store.positions[b, h].tolist()):
                    scores[p] += probs[b, h, slot].item()
                if len(scores) > budget:
                    victim = min((p for p in scores if p <= t - recent), key=scores.get)
                    del scores[victim]
        method.decode_step(layer, probs)
        for b in range(B):
            for h in range(H):
                assert sorted(layer.store.positions[b, h].tolist()) == sorted(kept[b][h])


@pytest.mark.parametrize(("pooling", "kernel"), [("max", 7), ("avg", 5), ("max", 1)])
def test_snapkv_keeps_the_naive_pooled_top_k_and_the_window(pooling, kernel):
    length, budget, window = 50, 20, 6
    method = SnapKV(window_size=window, kernel_size=kernel, pooling=pooling)
    q, k, v, _ = random_prompt(length, 2)
    layer = CompressedLayer(method.traits.state_fill, budget)
    layer.update(k, v)
    prefill_step(method, layer, q, None, None, SCALE)
    votes = naive_attention_matrix(q, k)[:, :, length - window :, : length - window].sum(dim=2)
    half = kernel // 2
    for b in range(B):
        for h in range(H):
            row = votes[b, h].tolist()
            pooled = []
            for i in range(len(row)):
                seg = row[max(0, i - half) : i + half + 1]
                pooled.append(max(seg) if pooling == "max" else sum(seg) / kernel)  # zero padding counted
            top = set(torch.topk(torch.tensor(pooled), budget - window).indices.tolist())
            assert set(layer.store.positions[b, h].tolist()) == top | set(range(length - window, length))
    assert layer.store.n_slots == budget


def test_snapkv_window_shrinks_for_budgets_below_it():
    assert [SnapKV(window_size=32).window(b) for b in (20, 31, 32, 33)] == [10, 15, 32, 32]


@pytest.mark.parametrize("rerotate", [True, False])
def test_streamingllm_keeps_exactly_sinks_and_recent(tiny_model, rerotate):
    from runners.generation.greedy import greedy_generate

    budget, n_sink = 12, 4
    history = []

    def check(cache) -> None:
        seen = cache.layers[0].get_seq_length()
        expected = list(range(n_sink)) + list(range(seen - (budget - n_sink), seen))
        for layer in cache.layers:
            assert layer.store.positions[..., :n_sink].tolist() == [
                [list(range(n_sink))] * 2
            ]  # sinks stay first
            assert torch.all(layer.store.positions.sort(dim=-1).values == torch.tensor(expected))
        history.append(seen)

    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    greedy_generate(tiny_model, ids, StreamingLLM(n_sink=n_sink, rerotate=rerotate), budget, 10, set(), check)
    assert history == list(range(30, 40))


def test_rerotated_key_equals_key_computed_at_that_position():
    from methods.seam.rope import LayerRotary

    model = tiny_llama()
    rotary = model.base_model.rotary_emb
    raw = torch.randn(1, 2, 5, 16)  # HF computes RoPE angles in float32: compare at that precision

    def rope(x, positions):
        cos, sin = rotary(x, torch.tensor([positions]))
        return apply_rotary_pos_emb(x, x, cos, sin)[1]

    at_p = rope(raw, [0, 1, 2, 3, 7])
    turn = LayerRotary(rotary)
    torch.testing.assert_close(turn.rerotate(at_p, 13), rope(raw, [13, 14, 15, 16, 20]))
    torch.testing.assert_close(turn.rerotate(at_p, -3), rope(raw, [-3, -2, -1, 0, 4]))


def test_streamingllm_attention_equals_the_papers_cache_index_positions():
    """Official StreamingLLM rotates key slot i to position i and the query to C - 1; ours keeps
    original positions and moves only the sinks. The decode attention output must be identical."""
    model = tiny_llama()
    rotary = model.base_model.rotary_emb
    n_sink, budget, length = 4, 10, 30
    method = StreamingLLM(n_sink=n_sink)

    def rope(x, positions):
        cos, sin = rotary(x, torch.tensor([positions]))
        return apply_rotary_pos_emb(x, x, cos, sin)[1]

    gen = torch.Generator().manual_seed(0)
    raw_k = torch.randn(1, 2, length, 16, generator=gen)
    values = torch.randn(1, 2, length, 16, generator=gen)
    layer = CompressedLayer(method.traits.state_fill, budget, LayerSpec(rotary=LayerRotary(rotary)))
    layer.update(rope(raw_k, list(range(length))), values)
    prefill_step(method, layer, torch.zeros(1, 6, length, 16), None, None, 0.25)
    kept = layer.store.positions[0, 0].tolist()
    raw_q = torch.randn(1, 6, 1, 16, generator=gen)
    ours, _ = method.decode_attention(layer, rope(raw_q, [length - 1]), 0.25)
    paper_k = rope(raw_k[:, :, kept], list(range(budget)))
    paper_logits = rope(raw_q, [budget - 1]) @ paper_k.repeat_interleave(3, 1).transpose(-1, -2)
    kept_v = values[:, :, kept].repeat_interleave(3, 1)
    paper = torch.softmax(paper_logits * 0.25, dim=-1) @ kept_v
    torch.testing.assert_close(ours, paper)
    original = torch.softmax(rope(raw_q, [length - 1]) @ layer.keys.repeat_interleave(3, 1).mT * 0.25, -1)
    assert not torch.allclose(original @ kept_v, paper)  # without re-rotation the sinks' logits differ


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (H2O, {"heavy_ratio": 0.8, "recent_ratio": 0.5}),
        (H2O, {"recent_ratio": -1}),
        (SnapKV, {"kernel_size": 4}),
        (SnapKV, {"pooling": "min"}),
        (StreamingLLM, {"n_sink": -1}),
    ],
)
def test_bad_hyperparameters_raise(cls, kwargs):
    with pytest.raises(ValueError):
        cls(**kwargs)


def test_weighted_column_sums_equal_the_weighted_full_matrix():
    q, k, _, _ = random_prompt(23, 4)
    weights = 0.9 ** torch.arange(22, -1, -1, dtype=torch.float64)
    expected = torch.einsum("bhqk,q->bhk", naive_attention_matrix(q, k), weights)
    torch.testing.assert_close(
        causal_column_sums(q, k, SCALE, 5, weights).double(), expected, rtol=1e-5, atol=1e-6
    )


def test_streamingllm_small_budget_keeps_fewer_sinks_and_the_newest_token(tiny_model):
    """A budget at or below n_sink (short prompt, small fraction) keeps budget - 1 sinks + the newest."""
    from methods import StreamingLLM
    from runners.generation.greedy import greedy_generate

    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(5))
    seen = []
    res = greedy_generate(
        tiny_model,
        ids,
        StreamingLLM(),
        3,
        4,
        set(),
        lambda c: seen.append(c.layers[0].store.positions[0, 0].tolist()),
    )
    assert res.slots == [3, 3]
    assert seen[0] == [0, 1, 29] and seen[-1] == [0, 1, 32]
