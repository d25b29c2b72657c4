"""R-KV and CriticalKV against references written here from each paper's rule.

A spy records what each layer holds when the method acts (keys and values by position, the queries);
a reference keeps its own token set per (layer, KV head) and must keep the same positions as the
method at prefill and after every decode step, with the plan's bound never exceeded. One tiny GQA
Llama (6 query heads on 2 KV heads), one prompt longer than every budget.
"""

from __future__ import annotations

import pytest
import torch

from methods import METHOD_REGISTRY, SnapKV
from runners.generation.greedy import greedy_generate
from tests.method_settings import NEW, prompt


def spied(cls: type, records: dict) -> type:
    """``cls`` recording per layer ``[kind, positions, keys, values, query, scaling, positions after]``
    (the prompt's queries at prefill, the step's query at a decode step)."""

    def seen(kind: str, layer, query, scaling) -> None:
        held = [layer.store.positions.clone(), layer.keys.clone(), layer.values.clone()]
        records.setdefault(layer.spec.layer_idx, []).append([kind, *held, query.clone(), scaling])

    class Spy(cls):
        def prefill(self, layer, query, scaling):
            seen("prefill", layer, query, scaling)
            super().prefill(layer, query, scaling)
            records[layer.spec.layer_idx][-1].append(layer.store.positions.clone())

        def decode_attention(self, layer, query, scaling):
            seen("step", layer, query, scaling)
            return super().decode_attention(layer, query, scaling)

        def decode_step(self, layer, probs):
            super().decode_step(layer, probs)
            records[layer.spec.layer_idx][-1].append(layer.store.positions.clone())

    return Spy


def run(model, method_cls, kwargs: dict, budget: int):
    """Generate with a spied method; assert the plan's bound holds after every step; the records."""
    records: dict[int, list] = {}
    method = spied(method_cls, records)(**kwargs)

    def check(cache) -> None:
        assert all(layer.store.n_slots <= layer.plan.bound for layer in cache.layers)

    greedy_generate(model, prompt(4), method, budget, NEW, set(), check)
    assert all(len(events) == NEW for events in records.values())  # the last token is never fed back
    return records


def pool(x: torch.Tensor, kernel: int) -> torch.Tensor:
    """Max over the ``kernel`` neighbours of each entry (SnapKV / R-KV pooling, 'same' length)."""
    r = kernel // 2
    return torch.stack([x[max(0, i - r) : i + r + 1].max() for i in range(len(x))])


# ---------------------------------------------------------------------------------------- R-KV
def rkv_scores(kw: dict, held: list[int], keys: dict, queries: list[torch.Tensor], scaling: float, w: int):
    """R-KV's ``Z`` of the prefix ``held[:-w]`` of one KV head (keys by position, the window's
    queries ``[group, head_dim]``): importance = mean over the window's queries of the softmax over
    the prefix of the group-max logits, max-pooled; redundancy = softmax over the held tokens of the
    column mean of the cosine matrix (diagonal and each row's latest copy above the threshold zeroed)."""
    prefix = held[:-w]
    k_prefix = torch.stack([keys[p] for p in prefix])
    importance = torch.stack([torch.softmax((q @ k_prefix.T * scaling).amax(0), 0) for q in queries]).mean(0)
    unit = torch.stack([keys[p] / keys[p].norm() for p in held])
    sim = unit @ unit.T
    sim.fill_diagonal_(0)
    for i in range(len(held)):
        copies = [j for j in range(len(held)) if sim[i, j] > kw.get("threshold", 0.5)]
        if copies:
            sim[i, max(copies)] = 0
    redundancy = torch.softmax(sim.mean(0), 0)[: len(prefix)]
    lam = kw.get("mix_lambda", 0.1)
    z = lam * pool(importance, kw.get("kernel_size", 7)) - (1 - lam) * redundancy
    return dict(zip(prefix, z.tolist(), strict=True))


@pytest.mark.parametrize(
    ("kwargs", "budget"),
    [({"window_size": 3, "buffer": 4, "kernel_size": 3}, 9), ({"window_size": 3, "buffer": 4}, 30), ({}, 30)],
)
def test_rkv_keeps_the_papers_tokens(tiny_model, kwargs, budget):
    keep, _, w = METHOD_REGISTRY["rkv"](**kwargs).split(budget)
    for events in run(tiny_model, METHOD_REGISTRY["rkv"], kwargs, budget).values():
        heads = events[0][2].shape[1]
        group = events[0][4].shape[1] // heads
        held = [[] for _ in range(heads)]
        keys = [{} for _ in range(heads)]
        queries = [{} for _ in range(heads)]  # position -> [group, head_dim]
        for kind, positions, k, _, query, scaling, after in events:
            for h in range(heads):
                for slot, p in enumerate(positions[0, h].tolist()):
                    keys[h].setdefault(p, k[0, h, slot])
                new = positions[0, h].tolist() if kind == "prefill" else [max(positions[0, h].tolist())]
                held[h] += new
                for i, p in enumerate(new):
                    queries[h][p] = query[0, h * group : (h + 1) * group, i - len(new)]
                if len(held[h]) > budget:
                    window = [queries[h][p] for p in held[h][-w:]]
                    z = rkv_scores(kwargs, held[h], keys[h], window, scaling, w)
                    top = sorted(z, key=z.get)[len(z) - (keep - w) :]
                    held[h] = sorted(top) + held[h][-w:]
                assert after[0, h].tolist() == held[h], (kind, h)


# ---------------------------------------------------------------------------------------- CriticalKV
SCORER = {"window_size": 4, "kernel_size": 3, "decode_budget": True}


def value_norm(weight: torch.Tensor, h: int, group: int, v: torch.Tensor) -> float:
    """``mean_g ||v W_o^g||_1`` over the query heads ``g`` of KV head ``h``, ``W_o^g`` the columns
    of ``o_proj.weight`` ``[hidden, q_heads * head_dim]`` that head ``g``'s output meets."""
    d = v.shape[-1]
    heads = range(h * group, (h + 1) * group)
    return sum((v @ weight[:, g * d : (g + 1) * d].T).abs().sum().item() for g in heads) / group


@pytest.mark.parametrize(("ratio", "budget", "eps"), [(0.5, 9, 1e-4), (0.5, 30, 1e-4), (0.0, 30, 0.05)])
def test_criticalkv_keeps_the_papers_tokens(tiny_model, ratio, budget, eps):
    """Stage 1: SnapKV's votes (window protected, as kvpress's highest score); stage 2:
    ``(votes / w + eps) * mean_g ||v W_o^g||_1`` with the layer's ``o_proj`` slice of each query head:
    the votes on kvpress's scale (the mean over the window of ``w`` queries) before epsilon is added
    (an epsilon large against the votes shows the scale)."""
    kwargs = {"scorer": SnapKV(**SCORER), "first_stage_ratio": ratio, "epsilon": eps}
    scorer = SnapKV(**SCORER)
    w = scorer.window(budget)
    records = run(tiny_model, METHOD_REGISTRY["criticalkv"], kwargs, budget)
    for layer_idx, events in records.items():
        weight = tiny_model.model.layers[layer_idx].self_attn.o_proj.weight.detach()
        heads = events[0][2].shape[1]
        group = events[0][4].shape[1] // heads

        held, votes, norms = (
            [[] for _ in range(heads)],
            [{} for _ in range(heads)],
            [{} for _ in range(heads)],
        )
        for kind, positions, k, v, query, scaling, after in events:
            for h in range(heads):
                pos = positions[0, h].tolist()
                q = query[0, h * group : (h + 1) * group].float()  # [group, q_len, head_dim]
                if kind == "prefill":
                    held[h] = pos
                    future = torch.arange(len(pos))[None, :] > torch.arange(len(pos) - w, len(pos))[:, None]
                    logits = torch.einsum("gqd,kd->gqk", q[:, -w:], k[0, h].float()) * scaling
                    col = torch.softmax(logits.masked_fill(future, -torch.inf), -1).mean(0).sum(0)
                    col = torch.cat([pool(col[:-w], SCORER["kernel_size"]), col[-w:]])
                    votes[h] = dict(zip(pos, col.tolist(), strict=True))
                    bound = budget
                else:
                    probs = torch.softmax(q[:, -1] @ k[0, h].T * scaling, -1).mean(0)
                    for slot, p in enumerate(pos):
                        votes[h][p] = votes[h].get(p, 0.0) + probs[slot].item()
                    held[h].append(max(pos))
                    bound = budget  # the layer holds `budget` between steps
                for slot, p in enumerate(pos):
                    norms[h].setdefault(p, value_norm(weight, h, group, v[0, h, slot].float()))
                if len(held[h]) > bound:
                    recent = sorted(held[h])[-w:]
                    rest = [p for p in held[h] if p not in recent]
                    first = max(0, int(ratio * bound) - w)
                    stage1 = sorted(rest, key=lambda p: votes[h][p])[len(rest) - first :] if first else []
                    stage2 = sorted(
                        (p for p in rest if p not in stage1),
                        key=lambda p: (votes[h][p] / w + eps) * norms[h][p],
                    )
                    kept = recent + stage1 + stage2[len(stage2) - (bound - w - first) :]
                    held[h] = [p for p in held[h] if p in kept]
                assert sorted(after[0, h].tolist()) == sorted(held[h]), (kind, layer_idx, h)


def test_criticalkv_composes_through_protected_and_prefill_scores(tiny_model):
    """An allocator's two calls: ``protected`` is the scorer's, ``prefill_scores`` gives a score to
    every prompt token (protected and stage-1 tokens the highest), and ``label`` names the scorer."""
    method = METHOD_REGISTRY["criticalkv"](scorer=SnapKV(**SCORER), first_stage_ratio=0.5)
    assert method.protected(9) == SnapKV(**SCORER).protected(9) and method.label == "criticalkv_snapkv"
    seen = []

    class Probe(type(method)):
        def prefill(self, layer, query, scaling):
            seen.append(self.prefill_scores(layer, query, scaling))
            super().prefill(layer, query, scaling)

    greedy_generate(tiny_model, prompt(4), Probe(scorer=SnapKV(**SCORER)), 20, 1, set())
    top = torch.finfo(torch.float32).max
    for scores in seen:
        assert scores.shape == (1, 2, 64) and torch.isfinite(scores).all()
        assert ((scores[..., :-4] == top).sum(-1) == int(0.5 * 20) - 4).all() and (
            scores[..., -4:] == top
        ).all()
