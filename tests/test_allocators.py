"""Budget allocators (AdaKV, PyramidKV, per-layer ratios, DuoAttention) and the ragged heads they need.

- AdaKV on a real prompt of the embedded model keeps what Algorithm 1, written here, keeps: per-head
  counts that differ, add up to ``heads x B`` and respect the safeguard floor; with a floor of the
  whole budget every head keeps its own top ``B`` and the tokens equal SnapKV's (ragged path vs
  uniform path).
- DuoAttention with every head streaming equals StreamingLLM without re-rotation (ragged decode
  eviction vs uniform); with none streaming it equals FullKV.
- A ragged layer's decode attention equals each head's attention over its own kept tokens.
- Memory: at every step a ragged layer holds the sum of its heads' slots plus what they may still
  receive (within 10% of the uniform layer at the same budget), never ``heads x max``.
- PyramidKV's and the ratio list's layer budgets follow their schedules and add up to the total.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from methods import AdaKV, DuoAttention, FullKV, LayerRatios, PyramidKV, SnapKV, StreamingLLM
from methods.pyramidkv import pyramid_budgets
from methods.seam.cache import CompressedCache
from methods.seam.step import decode_step, prefill_step
from runners.generation.greedy import greedy_generate
from tests.conftest import REPO
from tests.method_settings import NEW, prompt

PATTERN = str(REPO / "tests" / "data" / "duo_pattern_2x2.tsv")  # tiny_llama: 2 layers x 2 KV heads


def reference_adakv(
    scores: torch.Tensor, keep: int, window: int, alpha: float, kvpress: bool = False
) -> list[set[int]]:
    """AdaKV Algorithm 1 per head, written plainly: every head keeps its observation window and its
    top ``floor(alpha B)`` other tokens; the rest of the layer's ``heads x B`` goes to the highest
    remaining scores of any head. ``kvpress``: AdaKVPress's safeguard, ``max(1, floor(alpha B))``
    tokens of which the window (SnapKVPress's maximal scores) takes its share first."""
    heads, n = scores.shape
    kept = [set(range(n - window, n)) for _ in range(heads)]
    safe = max(0, max(1, int(keep * alpha)) - window) if kvpress else int(keep * alpha)
    for h in range(heads):
        order = sorted(range(n - window), key=lambda i: -scores[h, i].item())
        kept[h] |= set(order[:safe])
    rest = sorted(
        ((scores[h, i].item(), h, i) for h in range(heads) for i in range(n - window) if i not in kept[h]),
        reverse=True,
    )
    for _, h, i in rest[: heads * keep - sum(len(k) for k in kept)]:
        kept[h].add(i)
    return kept


def held_positions(layer) -> list[set[int]]:
    """Token positions each (batch 0) head of a ragged layer holds."""
    r = layer.store
    pos, seg, valid = r.buffers["positions"], r.segment, r.valid()
    return [set(pos[(seg == h) & valid].tolist()) for h in range(r.shape[1])]


def test_adakv_on_a_real_prompt_keeps_what_algorithm_1_keeps(embedded, data_dir):
    model, tokenizer = embedded
    document = json.loads((data_dir / "xsum" / "test.jsonl").read_text().splitlines()[0])["document"]
    ids = tokenizer(document, return_tensors="pt").input_ids[:, :400]
    budget, window, alpha = 60, 8, 0.2
    scores: dict[int, torch.Tensor] = {}

    class Recorded(SnapKV):
        def prefill_scores(self, layer, query, scaling):
            scores[layer.spec.layer_idx] = out = super().prefill_scores(layer, query, scaling)
            return out

    heads = model.config.num_key_value_heads
    by_rule = {}
    for kvpress in (False, True):  # the paper's safeguard, then kvpress's (preset adakv_snapkv_kvpress)
        # no pooling: max-pooled votes tie in runs, and a tie at the cut may go either way
        scorer = Recorded(window_size=window, kernel_size=1)
        method = AdaKV(scorer=scorer, alpha_safeguard=alpha, safeguard_protected=kvpress)
        kept: dict[int, list[set[int]]] = {}

        def record(cache, kept=kept) -> None:
            if not kept:
                kept.update({layer.spec.layer_idx: held_positions(layer) for layer in cache.layers})

        greedy_generate(model, ids, method, budget, 2, set(), record)
        differ = 0
        for idx, held in kept.items():
            assert held == reference_adakv(scores[idx][0], budget, window, alpha, kvpress), idx
            counts = [len(h) for h in held]
            assert sum(counts) == heads * budget
            floor = max(window, max(1, int(alpha * budget))) if kvpress else window + int(alpha * budget)
            assert min(counts) >= floor
            differ += len(set(counts)) > 1
        assert differ > len(kept) // 2  # most layers give their heads different counts
        by_rule[kvpress] = kept
    assert by_rule[False] != by_rule[True]  # the safeguards differ on this prompt


def test_adakv_with_the_whole_budget_as_floor_equals_snapkv(tiny_model):
    """Each head then keeps its own top B: equal counts through the ragged path give SnapKV's tokens."""
    scorer = SnapKV(window_size=4, kernel_size=1)  # no pooling: no ties for the two top-k to break apart
    snap = greedy_generate(tiny_model, prompt(5), scorer, 16, NEW, set())
    ada = greedy_generate(tiny_model, prompt(5), AdaKV(scorer=scorer, alpha_safeguard=1.0), 16, NEW, set())
    assert ada.tokens == snap.tokens and ada.kv_bytes == snap.kv_bytes


@pytest.mark.parametrize("sparsity", [0.0, 1.0])
def test_duo_attention_at_the_ends_equals_fullkv_and_streamingllm(tiny_model, sparsity):
    duo = DuoAttention(pattern=PATTERN, sparsity=sparsity, sink_size=2, recent_size=10)
    got = greedy_generate(tiny_model, prompt(6), duo, None, NEW, set()).tokens
    if sparsity == 0:
        want = greedy_generate(tiny_model, prompt(6), FullKV(), None, NEW, set()).tokens
    else:  # every head streaming: sinks + recent window, evicting the oldest non-sink each step
        want = greedy_generate(
            tiny_model, prompt(6), StreamingLLM(n_sink=2, rerotate=False), 12, NEW, set()
        ).tokens
    assert got == want


def test_ragged_decode_attention_is_each_heads_attention_over_its_own_tokens():
    torch.manual_seed(0)
    b, h, g, n, d = 1, 3, 2, 40, 8
    keys, values = torch.randn(b, h, n + 1, d), torch.randn(b, h, n + 1, d)
    query = torch.randn(b, h * g, n, d)
    cache = CompressedCache(AdaKV(scorer=SnapKV(window_size=4)), 12, 1, max_tokens=n + 1)
    layer = cache.layers[0]
    layer.update(keys[:, :, :n], values[:, :, :n])
    prefill_step(cache.rules[0], layer, query, None, None, 0.5)
    held = held_positions(layer)
    assert len({len(p) for p in held}) > 1  # the heads really differ
    layer.update(keys[:, :, n:], values[:, :, n:])
    q = torch.randn(b, h * g, 1, d)
    out = decode_step(cache.rules[0], layer, q, 0.5)
    for head in range(h):
        idx = torch.tensor(sorted(held[head] | {n}))
        k, v = keys[0, head, idx], values[0, head, idx]
        for j in range(g):
            row = q[0, head * g + j, 0]
            want = torch.softmax(k @ row * 0.5, -1) @ v
            torch.testing.assert_close(out[0, head * g + j, 0], want, atol=1e-5, rtol=1e-5)


def test_ragged_heads_without_room_grow_and_keep_every_token():
    """Growing heads made with no room take more tokens than one growth adds (``GROWTH``): every
    token stays where its head holds it; a bounded head dropping its oldest slot stays at its bound."""
    from methods.seam.ragged import GROWTH, RaggedStore

    torch.manual_seed(0)
    b, h, n, d, new = 1, 3, 10, 4, GROWTH + 5
    keys, values = torch.randn(b, h, n + new, d), torch.randn(b, h, n + new, d)
    positions = torch.arange(n + new).expand(b, h, -1)
    keep = torch.rand(b, h, n) < 0.6
    keep[..., 0] = True
    fields = {"keys": keys[:, :, :n], "values": values[:, :, :n], "positions": positions[:, :, :n]}
    bounds = torch.tensor([[-1, -1, 3]])
    store = RaggedStore.from_mask(fields, keep, room=0, bounds=bounds)
    held = [positions[0, i, :n][keep[0, i]].tolist() for i in range(h)]
    for t in range(n, n + new):
        store.append(keys[:, :, t : t + 1], values[:, :, t : t + 1], torch.tensor([t]))
        held = [[*p, t] for p in held]
        if len(held[2]) > 3:  # the bounded head evicts its first slot; its last moves there
            store.drop(torch.zeros(b, h, dtype=torch.long), torch.tensor([[False, False, True]]))
            held[2] = [held[2][-1], *held[2][1:-1]]
    view = store.view("positions")[0]
    for i in range(h):
        assert view[i, : len(held[i])].tolist() == held[i] and (view[i, len(held[i]) :] == -1).all()
        torch.testing.assert_close(store.view("keys")[0, i, : len(held[i])], keys[0, i, held[i]])
    kept = keep[0].sum(-1)
    assert (store.capacity[:2] >= kept[:2] + new).all()  # grown (made with no room)
    assert int(store.capacity[2]) == max(3, int(kept[2])) + 1  # a bounded head never grows


def test_ragged_memory_is_the_sum_of_the_heads_at_every_step(tiny_model):
    """Allocated bytes = the heads' kept slots + the tokens still to come per head (+ the positions
    and index tensors), within 10% of the uniform layer at the same budget; never heads x max."""
    budget, remaining = 16, NEW - 1
    uniform: list[int] = []
    greedy_generate(
        tiny_model,
        prompt(7),
        SnapKV(window_size=4),
        budget,
        NEW,
        set(),
        lambda c: uniform.append(c.allocated_bytes()),
    )
    steps: list[int] = []

    def check(cache) -> None:
        steps.append(cache.allocated_bytes())
        for layer in cache.layers:
            r = layer.store
            slot = sum(t[:1].nbytes for t in r.buffers.values())  # K + V + position of one slot
            index = 2 * r.segment.nbytes + 3 * r.offsets.nbytes
            kept = int(r.head_slots().sum()) - r.shape[1] * (len(steps) - 1)  # what prefill kept
            assert kept == r.shape[1] * budget  # the layer's budget, shared unevenly
            assert layer.store.allocated_bytes() == (kept + remaining * r.shape[1]) * slot + index
            slots = r.head_slots()
            if slots.min() < slots.max():  # never heads x max
                assert (
                    layer.store.allocated_bytes() - index < r.shape[1] * (int(slots.max()) + remaining) * slot
                )

    method = AdaKV(scorer=SnapKV(window_size=4))
    greedy_generate(tiny_model, prompt(7), method, budget, NEW, set(), check)
    assert len(steps) == len(uniform) == NEW
    assert all(a <= 1.10 * u for a, u in zip(steps, uniform, strict=True))


def test_duo_attention_streaming_heads_stay_within_their_window(tiny_model):
    duo = DuoAttention(pattern=PATTERN, sparsity=0.5, sink_size=2, recent_size=10)
    seen: list[list[int]] = []

    def check(cache) -> None:
        for layer in cache.layers:
            slots = layer.store.head_slots()[0]
            streaming = ~torch.as_tensor(duo.retrieval[layer.spec.layer_idx])
            assert (slots[streaming] <= 12).all() and (slots[~streaming] == layer.get_seq_length()).all()
            seen.append(slots.tolist())

    greedy_generate(tiny_model, prompt(8), duo, None, NEW, set(), check)
    assert len(seen) == NEW * 2


def test_pyramid_budgets_follow_the_linear_schedule():
    budgets = pyramid_budgets(budget=100, protected=32, prompt=1000, layers=30, beta=20)
    r = 100 - 32
    assert sum(budgets) == 30 * 100
    assert budgets[0] == 32 + round(2 * r - r / 20) and budgets[-1] == 32 + round(r / 20)
    high, low = 2 * r - r / 20, r / 20  # Sec. 3.3: an arithmetic sequence from high to low
    linear = [32 + high - i * (high - low) / 29 for i in range(30)]
    assert all(abs(b - v) < 1 for b, v in zip(budgets, linear, strict=True))
    assert all(a >= b for a, b in itertools.pairwise(budgets))
    # capped at the prompt: the top layer keeps the whole prompt, the mean stays the budget
    capped = pyramid_budgets(budget=600, protected=32, prompt=1000, layers=4, beta=20)
    assert capped[0] == 1000 and sum(capped) == 4 * 600
    assert pyramid_budgets(budget=10, protected=32, prompt=1000, layers=4, beta=20) == [10] * 4


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (PyramidKV(scorer=SnapKV(window_size=4), beta=4), pyramid_budgets(16, 4, 64, 2, 4)),
        (LayerRatios(scorer=SnapKV(window_size=4), ratios=[3, 1]), [24, 8]),
    ],
    ids=["pyramidkv", "layer_ratios"],
)
def test_layer_budgets_are_kept_per_layer(tiny_model, method, expected):
    held: list[list[int]] = []
    greedy_generate(tiny_model, prompt(9), method, 16, 2, set(), lambda c: held.append(c.n_slots))
    assert held[0] == expected and sum(expected) == 2 * 16
