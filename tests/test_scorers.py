"""TOVA, KNorm, KeyDiff and Random against references written here from each paper's rule.

A spy records what each layer holds when the method acts (keys by position, the step's query); a
reference keeps its own token set per (layer, KV head) with the rule written from the paper and must
keep the same positions as the method at prefill and after every decode step, with the budget never
exceeded. One tiny GQA Llama (6 query heads on 2 KV heads), one prompt, two budgets per method.
"""

from __future__ import annotations

import math

import pytest
import torch

from methods.random import hashed_uniform
from tests.method_settings import NEW, generate_spied


def spied(cls: type, records: dict) -> type:
    """``cls`` recording, per layer, ``(kind, positions, keys, query, scaling)`` before each action
    (the decode step's query from its attention) and the positions after it."""

    class Spy(cls):
        def prefill(self, layer, query, scaling):
            records.setdefault(layer.spec.layer_idx, []).append(
                [
                    "prefill",
                    layer.store.positions.clone(),
                    layer.keys.clone(),
                    query[:, :, -1].clone(),
                    scaling,
                ]
            )
            super().prefill(layer, query, scaling)
            records[layer.spec.layer_idx][-1].append(layer.store.positions.clone())

        def decode_attention(self, layer, query, scaling):
            records[layer.spec.layer_idx].append(
                ["step", layer.store.positions.clone(), layer.keys.clone(), query[:, :, -1].clone(), scaling]
            )
            return super().decode_attention(layer, query, scaling)

        def decode_step(self, layer, probs):
            super().decode_step(layer, probs)
            records[layer.spec.layer_idx][-1].append(layer.store.positions.clone())

    return Spy


def paper_scores(name: str, kwargs: dict, kept: list[list[int]], keys: dict, query, scaling, layer_idx: int):
    """Each paper's score per KV head for the positions in ``kept[h]``: ``list[dict[pos, score]]``."""
    heads = len(kept)
    if name == "knorm":  # Devoto et al. 2024: low ||k|| is important
        return [{p: -keys[h][p].norm().item() for p in kept[h]} for h in range(heads)]
    if name == "keydiff":  # Park et al. 2025: -cos(k, mean of unit keys of the cache)
        out = []
        for h in range(heads):
            anchor = torch.stack([keys[h][p] / keys[h][p].norm() for p in kept[h]]).mean(0)
            out.append({p: -torch.cosine_similarity(keys[h][p], anchor, dim=0).item() for p in kept[h]})
        return out
    if name == "random":  # one fixed seeded uniform score per token
        out = []
        for h in range(heads):
            pos = torch.tensor(kept[h]).view(1, 1, -1).expand(1, heads, -1)
            u = hashed_uniform(pos, kwargs.get("seed", 0), layer_idx)[0, h].tolist()
            out.append(dict(zip(kept[h], u, strict=True)))
        return out
    # TOVA (Oren et al. 2024): the current query's attention, averaged over all query heads
    assert all(sorted(k) == sorted(kept[0]) for k in kept)  # every head holds the same tokens
    group = query.shape[0] // heads
    probs = [
        torch.softmax(torch.stack([keys[q // group][p] for p in kept[0]]) @ query[q] * scaling, dim=0)
        for q in range(query.shape[0])
    ]
    mean = torch.stack(probs).mean(0).tolist()
    return [dict(zip(kept[0], mean, strict=True)) for _ in range(heads)]


def protected_recent(name: str, kwargs: dict, budget: int) -> int:
    """Newest tokens never evicted: TOVA the newest one (kvpress) plus ``recent``; the others none."""
    return min(max(kwargs.get("recent", 0), 1), budget) if name == "tova" else 0


CASES = [
    pytest.param(name, kwargs, budget, id=f"{name}-{budget}")
    for name, kwargs in (
        ("tova", {}),
        ("tova", {"recent": 3}),
        ("knorm", {}),
        ("keydiff", {}),
        ("random", {"seed": 5}),
    )
    for budget in (9, 30)
]


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_kept_positions_match_the_papers_rule(tiny_model, name, kwargs, budget):
    records = generate_spied(tiny_model, spied, name, kwargs, budget)
    recent = protected_recent(name, kwargs, budget)
    for layer_idx, events in records.items():
        assert [e[0] for e in events][:2] == ["prefill", "step"] and len(events) >= NEW
        keys: list[dict[int, torch.Tensor]] = [{} for _ in range(events[0][2].shape[1])]
        kept: list[list[int]] = [[] for _ in keys]
        for kind, positions, k, query, scaling, after in events:
            for h in range(len(keys)):  # what the layer holds now that the reference has not seen
                for slot, p in enumerate(positions[0, h].tolist()):
                    keys[h].setdefault(p, k[0, h, slot].float())
                    if p not in kept[h] and (kind == "prefill" or p == max(positions[0, h].tolist())):
                        kept[h].append(p)
            scores = paper_scores(name, kwargs, kept, keys, query[0].float(), scaling, layer_idx)
            for h in range(len(keys)):
                newest = sorted(kept[h])[len(kept[h]) - recent :] if recent else []
                rest = sorted((p for p in kept[h] if p not in newest), key=lambda p: scores[h][p])
                if kind == "prefill" and len(kept[h]) > budget:
                    kept[h] = newest + rest[len(rest) - (budget - len(newest)) :]
                elif kind == "step" and len(kept[h]) > budget:
                    kept[h].remove(rest[0])
                assert sorted(after[0, h].tolist()) == sorted(kept[h]), (kind, layer_idx, h)


def test_random_scores_are_uniform_and_seeded():
    pos = torch.arange(4096).view(1, 1, -1).expand(1, 2, -1)
    u = hashed_uniform(pos, 0, 0)
    assert 0 <= u.min() and u.max() < 1
    assert math.isclose(u.mean().item(), 0.5, abs_tol=0.02)
    assert math.isclose(u.var().item(), 1 / 12, abs_tol=0.005)
    assert not torch.equal(u[0, 0], u[0, 1])  # heads differ
    assert not torch.equal(u, hashed_uniform(pos, 1, 0)) and not torch.equal(u, hashed_uniform(pos, 0, 1))
    assert torch.equal(u, hashed_uniform(pos, 0, 0))


@pytest.mark.parametrize("budget", [80, 120])
def test_snapkv_avg_preset_keeps_kvpress_snapkv_tokens(budget):
    """``method=snapkv_avg`` against kvpress's ``SnapKVPress.score`` written from its code (window 64,
    kernel 5): per query head the window's mean attention over the prefix, ``avg_pool1d`` with
    PyTorch's default padding (zero padding counted at the edges), the group mean, the window kept."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from methods.seam.layer import CompressedLayer
    from methods.seam.step import prefill_step
    from tests.conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        method = instantiate(compose("config", overrides=["method=snapkv_avg"]).method)
    gen = torch.Generator().manual_seed(5)
    n, w, k, hkv, group, d = 200, 64, 5, 2, 3, 8
    assert (method.window_size, method.kernel_size, method.pooling) == (w, k, "avg")
    keys, query = torch.randn(1, hkv, n, d, generator=gen), torch.randn(1, hkv * group, n, d, generator=gen)
    layer = CompressedLayer(method.traits.state_fill, budget)
    layer.update(keys, torch.randn(1, hkv, n, d, generator=gen))
    prefill_step(method, layer, query, None, None, d**-0.5)
    for h in range(hkv):
        q = query[0, h * group : (h + 1) * group, -w:]  # [group, w, d]
        logits = q @ keys[0, h].T * d**-0.5
        future = torch.arange(n)[None, :] > torch.arange(n - w, n)[:, None]
        attn = torch.softmax(logits.masked_fill(future, -torch.inf), -1)[..., : n - w]
        scores = torch.nn.functional.avg_pool1d(attn.mean(1)[:, None], k, stride=1, padding=k // 2)
        top = scores[:, 0].mean(0).topk(budget - w).indices
        want = sorted(top.tolist() + list(range(n - w, n)))
        assert sorted(layer.store.positions[0, h].tolist()) == want, h
