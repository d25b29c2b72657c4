"""Expected Attention and LagKV against references written here from each paper's rule.

As tests/test_scorers.py: a spy records what each layer holds when the method acts; a reference keeps
its own token set per (layer, KV head) and must keep the same positions at prefill and after every
decode step, with the budget never exceeded. One tiny GQA Llama (6 query heads on 2 KV heads).

Expected Attention's reference is the paper's closed form with explicit RoPE matrices (kvpress's
``R = cos I + sin P``): pre-RoPE queries ``R(s)^T q_s``, ``R_bar = mean_j R(t + j)``,
``z = mu_bar^T k / sqrt(d) + k^T Sigma_bar k / 2d``. LagKV's ranks tokens by tuples (scored tokens by
rank then partition, or by score; the rest by position), not by the method's float code.
"""

from __future__ import annotations

import math

import pytest
import torch

from methods import METHOD_REGISTRY
from runners.generation.greedy import greedy_generate
from tests.method_settings import NEW, generate_spied, prompt


def spied(cls: type, records: dict) -> type:
    """``cls`` recording per layer ``[kind, positions, keys, values, query, rotary]`` before each
    action (the prompt's queries, or the step's query) and the positions after it."""

    def record(layer, kind, query):
        entry = [kind, layer.store.positions.clone(), layer.keys.clone(), layer.values.clone(), query.clone()]
        records.setdefault(layer.spec.layer_idx, []).append([*entry, layer.spec.rotary])

    class Spy(cls):
        def prefill(self, layer, query, scaling):
            record(layer, "prefill", query)
            super().prefill(layer, query, scaling)
            records[layer.spec.layer_idx][-1].append(layer.store.positions.clone())

        def decode_attention(self, layer, query, scaling):
            record(layer, "step", query)
            return super().decode_attention(layer, query, scaling)

        def decode_step(self, layer, probs):
            super().decode_step(layer, probs)
            records[layer.spec.layer_idx][-1].append(layer.store.positions.clone())

    return Spy


def rope_matrix(rotary, p: int) -> torch.Tensor:
    """RoPE at position ``p`` as a ``[d, d]`` float64 matrix (kvpress's ``cos I + sin P``)."""
    cos, sin = rotary.rotary_emb(torch.zeros(1), torch.tensor([[p]]))
    cos, sin = cos[0, 0].double(), sin[0, 0].double()
    d = cos.shape[0]
    turn = torch.zeros(d, d, dtype=torch.float64)
    turn[d // 2 :, : d // 2], turn[: d // 2, d // 2 :] = torch.eye(d // 2), -torch.eye(d // 2)
    return torch.diag(cos) + torch.diag(sin) @ turn


class ExpectedAttentionReference:
    """Devoto et al. 2025, Secs. 3.2-3.3, with the decode rule of methods/expected_attention.py."""

    def __init__(self, kwargs: dict) -> None:
        self.n_future = kwargs.get("n_future_positions", 512)
        self.n_sink = kwargs.get("n_sink", 4)
        self.cov, self.vnorm = kwargs.get("use_covariance", True), kwargs.get("use_vnorm", True)
        self.eps = kwargs.get("epsilon", 0.0)
        self.queries: list[torch.Tensor] = []  # pre-RoPE, [q_heads, d] each

    def observe(self, kind: str, query: torch.Tensor, newest: int, rotary) -> None:
        rows = range(min(self.n_sink, query.shape[1] - 1), query.shape[1]) if kind == "prefill" else [0]
        for s in rows:
            at = s if kind == "prefill" else newest
            self.queries.append(query[:, s].double() @ rope_matrix(rotary, at))  # R(s)^T q, per head

    def scores(self, kept: list[list[int]], keys, values, newest: int, rotary) -> list[dict[int, float]]:
        q = torch.stack(self.queries)  # [n, q_heads, d]
        mu, centred = q.mean(0), q - q.mean(0)
        sigma = torch.einsum("nhd,nhe->hde", centred, centred) / q.shape[0]
        r_bar = torch.stack([rope_matrix(rotary, newest + j) for j in range(1, self.n_future + 1)]).mean(0)
        mu_bar, sigma_bar = mu @ r_bar.T, r_bar @ sigma @ r_bar.T
        heads, d = len(kept), q.shape[-1]
        group = q.shape[1] // heads
        out = []
        for h in range(heads):
            rest = [p for p in kept[h] if p >= self.n_sink]
            k = torch.stack([keys[h][p] for p in rest]).double()
            a = 0
            for g in range(h * group, (h + 1) * group):
                z = k @ mu_bar[g] / math.sqrt(d)
                if self.cov:
                    z = z + torch.einsum("sd,de,se->s", k, sigma_bar[g], k) / (2 * d)
                a = a + torch.softmax(z, dim=0) / group
            if self.vnorm:
                a = (a + self.eps) * torch.stack([values[h][p].double().norm() for p in rest])
            out.append(dict(zip(rest, a.tolist(), strict=True)))
        return out


class LagKVReference:
    """Liang et al. 2025, Sec. 3: partitions by position, each scored against the next once it is
    complete (with the tokens held then), the rest ranked by position."""

    def __init__(self, kwargs: dict) -> None:
        self.n_sink, self.lag = kwargs.get("n_sink", 4), kwargs.get("lag_size", 128)
        self.cross = kwargs.get("cross_scoring", False)
        self.scored: list[dict[int, tuple]] = []

    def part(self, p: int) -> int:
        return (p - self.n_sink) // self.lag

    def score_partition(self, h: int, m: int, held: list[int], keys, values) -> None:
        target = sorted(p for p in held if p >= self.n_sink and self.part(p) == m)
        ref = [p for p in held if p >= self.n_sink and self.part(p) == m + 1]
        total = 0
        for x in (keys, values):
            r = torch.stack([x[h][p] for p in ref]).double()
            low, high = r.min(0).values, r.max(0).values
            std = torch.stack([((x[h][p].double() - low) / (high - low)).std() for p in target])
            total = total + torch.softmax(std, dim=0) / 2
        order = sorted(range(len(target)), key=lambda i: total[i].item())
        for rank, i in enumerate(order):
            self.scored[h][target[i]] = (0, total[i].item()) if self.cross else (0, rank, m)

    def observe(self, kind: str, query, newest: int, rotary) -> None:
        self.newest = newest

    def scores(self, kept: list[list[int]], keys, values, newest: int, rotary) -> list[dict[int, tuple]]:
        self.scored = self.scored or [{} for _ in kept]
        full = (newest + 1 - self.n_sink) // self.lag
        for h, held in enumerate(kept):
            for m in range(full - 1):
                if any(self.part(p) == m and p >= self.n_sink and p not in self.scored[h] for p in held):
                    self.score_partition(h, m, held, keys, values)
        return [{p: self.scored[h].get(p, (1, p)) for p in held} for h, held in enumerate(kept)]


CASES = [
    pytest.param(name, kwargs, budget, id=f"{name}-{'-'.join(map(str, kwargs.values()))}-{budget}")
    for name, kwargs, budget in (
        ("expected_attention", {}, 9),
        ("expected_attention", {}, 30),
        # (epsilon > 0 ties repeated tokens whose attention underflows: (a + eps) ||v|| = eps ||v||)
        ("expected_attention", {"n_sink": 1, "n_future_positions": 16}, 20),
        ("expected_attention", {"use_covariance": False, "use_vnorm": False}, 30),
        ("expected_attention", {"recent": 3}, 12),
        ("lagkv", {"n_sink": 2, "lag_size": 8}, 9),
        ("lagkv", {"n_sink": 2, "lag_size": 8}, 30),
        ("lagkv", {"lag_size": 16}, 40),
        ("lagkv", {"n_sink": 2, "lag_size": 8, "cross_scoring": True}, 30),
    )
]


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_kept_positions_match_the_papers_rule(tiny_model, name, kwargs, budget):
    records = generate_spied(tiny_model, spied, name, kwargs, budget)
    first = max(0, min(kwargs.get("n_sink", 4), budget - 1))
    recent = min(kwargs.get("recent", 0), budget - first)
    evictions = 0
    for events in records.values():
        assert [e[0] for e in events][:2] == ["prefill", "step"] and len(events) >= NEW
        reference = (ExpectedAttentionReference if name == "expected_attention" else LagKVReference)(kwargs)
        keys: list[dict[int, torch.Tensor]] = [{} for _ in range(events[0][2].shape[1])]
        values: list[dict[int, torch.Tensor]] = [{} for _ in keys]
        kept: list[list[int]] = [[] for _ in keys]
        for kind, positions, k, v, query, rotary, after in events:
            newest = int(positions.max())
            for h in range(len(keys)):  # what the layer holds now that the reference has not seen
                for slot, p in enumerate(positions[0, h].tolist()):
                    keys[h].setdefault(p, k[0, h, slot].float())
                    values[h].setdefault(p, v[0, h, slot].float())
                    if p not in kept[h] and (kind == "prefill" or p == newest):
                        kept[h].append(p)
            reference.observe(kind, query[0], newest, rotary)
            scores = reference.scores(kept, keys, values, newest, rotary)
            for h in range(len(keys)):
                newest_kept = sorted(kept[h])[len(kept[h]) - recent :] if recent else []
                rest = [p for p in kept[h] if p >= first and p not in newest_kept]
                rest = sorted(rest, key=lambda p: scores[h][p])
                if len(kept[h]) > budget:
                    drop = rest[: len(kept[h]) - budget]
                    kept[h] = [p for p in kept[h] if p not in drop]
                    evictions += len(drop)
                assert sorted(after[0, h].tolist()) == sorted(kept[h]), (kind, newest, h)
    assert evictions > NEW  # the rule decided at prefill and at decode steps


def test_lagkv_scores_whole_partitions_at_prefill_and_the_completed_one_in_decode(tiny_model):
    """Where each kind of score comes from: scored partitions below 1, the rest ``2 + position``;
    a partition completing during decoding is scored at that step and never again."""
    records: dict[int, list] = {}
    method = spied(METHOD_REGISTRY["lagkv"], records)(n_sink=2, lag_size=8)
    cache_scores = []
    greedy_generate(
        tiny_model,
        prompt(4),
        method,
        200,
        NEW,
        set(),
        lambda c: cache_scores.append(c.layers[0].store.state["scores"].clone()),
    )
    # prompt 64 = 2 sinks + 7 partitions of 8 + 6: partitions 0..5 scored, 6 and the remainder not
    positions = torch.arange(64 + NEW - 1)
    part = (positions - 2) // 8
    for step, scores in enumerate(cache_scores):
        held = scores[0, 0, : 64 + step]
        full = (64 + step - 2) // 8
        scored = (positions[: 64 + step] >= 2) & (part[: 64 + step] <= full - 2)
        assert (held[scored] < 1).all() and (held[~scored] == positions[: 64 + step][~scored] + 2).all()
    # partition 6 is scored at the step that completes partition 7 (position 65 appended), then frozen
    first = 66 - 64
    assert torch.equal(cache_scores[first][..., 50:58], cache_scores[-1][..., 50:58])
    codes = cache_scores[first][0, :, 50:58] * 2.0**24
    ranks, parts = codes.div(2**21, rounding_mode="floor"), codes.remainder(2**21)
    assert (parts == 6).all() and all(sorted(r.tolist()) == list(range(8)) for r in ranks)


def test_expected_attention_holds_its_statistics_only_to_rescore(tiny_model):
    """Prompt-only (the leaderboard's rule), nothing re-scores after the prompt: the cache holds the kept
    slots' keys and values and no query statistics; under its paper rule it holds them at every step."""
    held: dict[bool, list[int]] = {True: [], False: []}
    for prompt_only in held:
        method = METHOD_REGISTRY["expected_attention"](decode_budget=not prompt_only)

        def extra(cache, prompt_only=prompt_only):
            held[prompt_only].append(cache.kv_bytes() - sum(layer.store.kv_bytes() for layer in cache.layers))

        greedy_generate(tiny_model, prompt(4), method, 24, NEW, set(), extra)
    assert held[True] == [0] * NEW
    assert len(held[False]) == NEW and min(held[False]) > 0
