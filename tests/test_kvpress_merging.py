"""Merging (kvpress ``MergingPress``) and CaM (kvpress ``CAMPress``) against references written here from
kvpress's rules: loops over heads and tokens on tiny random tensors (2 KV heads, 3 query heads each)."""

from __future__ import annotations

import math

import pytest
import torch

from methods import CAM, KNorm, Merging, SnapKV
from tests.press_fixtures import GROUP, HKV, D, attention, kept, prefilled, tensors


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b) / max(float(a.norm()), 1e-6) / max(float(b.norm()), 1e-6)


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, torch.quantile's)."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if xs[lo] == -math.inf:
        return -math.inf
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def merging_reference(keys, values, keep: list[list[int]], threshold: float, fraction: float) -> list:
    """Per head, ``{position: merged value}`` of the kept tokens (kvpress ``MergingPress.merge``)."""
    out = []
    for h in range(HKV):
        k, v = keys[0, h].double(), values[0, h].double()
        evicted = [i for i in range(k.shape[0]) if i not in keep[h]]
        best = [max(keep[h], key=lambda t, e=e: cosine(k[e], k[t])) for e in evicted]
        sims = [cosine(k[e], k[t]) for e, t in zip(evicted, best, strict=True)]
        ok = [s >= threshold for s in sims]
        if fraction < 1.0 and any(ok):
            floor = quantile([s if o else -math.inf for s, o in zip(sims, ok, strict=True)], 1 - fraction)
            ok = [o and s >= floor for s, o in zip(sims, ok, strict=True)]
        acc = {t: [torch.zeros(D, dtype=torch.float64), 0.0] for t in keep[h]}
        for e, t, s, o in zip(evicted, best, sims, ok, strict=True):
            w = max(s, 0.0) * o * float(v[e].norm()) / (float(v[e].norm()) + float(v[t].norm()) + 1e-6)
            acc[t][0] += w * v[e]
            acc[t][1] += w
        out.append({t: (v[t] + a) / (1 + w) if w > 0 else v[t] for t, (a, w) in acc.items()})
    return out


@pytest.mark.parametrize(
    ("scorer", "threshold", "fraction"), [(KNorm(), 0.0, 1.0), (SnapKV(window_size=3), 0.1, 0.6)]
)
def test_merging_folds_each_evicted_value_into_its_most_key_similar_survivor(scorer, threshold, fraction):
    keys, values, query = tensors(16, seed=4)
    alone = prefilled(scorer, keys, values, query, 7)
    layer = prefilled(
        Merging(scorer=scorer, similarity_threshold=threshold, merge_fraction=fraction),
        keys,
        values,
        query,
        7,
    )
    assert kept(layer) == kept(alone) and layer.store.n_slots == 7  # the scorer's tokens; the rest freed
    ref = merging_reference(keys, values, kept(alone), threshold, fraction)
    changed = 0
    for h in range(HKV):
        for slot, pos in enumerate(layer.store.positions[0, h].tolist()):
            torch.testing.assert_close(layer.values[0, h, slot].double(), ref[h][pos], atol=1e-5, rtol=1e-5)
            changed += not torch.equal(layer.values[0, h, slot], values[0, h, pos])
    assert changed > 0
    torch.testing.assert_close(
        layer.keys, keys.gather(2, layer.store.positions[..., None].expand(-1, -1, -1, D))
    )


def test_merging_options_are_checked():
    for bad in ({"similarity_threshold": -0.1}, {"merge_fraction": 0.0}, {"merge_fraction": 1.5}):
        with pytest.raises(ValueError):
            Merging(**bad)


class CamReference:
    """kvpress ``CAMPress`` on one layer, in lists: KNorm scores, every step's attention given."""

    def __init__(self, keys, values, first_attn, target: int, interval: int, budget: int) -> None:
        self.k = [list(keys[0, h].double()) for h in range(HKV)]
        self.v = [list(values[0, h].double()) for h in range(HKV)]
        self.a = [list(first_attn[h].double()) for h in range(HKV)]
        self.pos = list(range(keys.shape[2]))
        self.target, self.interval, self.budget, self.steps = target, interval, budget, 1
        self.maybe_compress()

    def step(self, key, value, attn, position: int) -> None:
        for h in range(HKV):
            self.k[h].append(key[0, h, 0].double())
            self.v[h].append(value[0, h, 0].double())
            self.a[h] = [x + float(p) for x, p in zip([*self.a[h], 0.0], attn[0, h], strict=True)]
        self.pos.append(position)
        self.steps += 1
        self.maybe_compress()

    def maybe_compress(self) -> None:
        n = len(self.pos)
        if self.steps < self.interval or n <= self.target:
            return
        score = [sum(-float(self.k[h][i].norm()) for h in range(HKV)) / HKV for i in range(n)]
        by_score = sorted(range(n), key=lambda i: score[i])
        evicted, kept = sorted(by_score[: n - self.target]), sorted(by_score[n - self.target :])
        merging = sorted(sorted(evicted, key=lambda i: (-score[i], -i))[: self.steps])
        windows = [[t for t in kept if t > i][: self.budget] for i in merging]
        prob = torch.zeros(1, HKV, len(merging))
        for h in range(HKV):
            for j, (i, win) in enumerate(zip(merging, windows, strict=True)):
                mean = sum(self.a[h][t] for t in win) / max(len(win), 1)
                p = self.a[h][i] / mean if mean else (0.0 if self.a[h][i] == 0 else 1.0)
                prob[0, h, j] = min(max(p, 0.0), 1.0)
        mask = torch.bernoulli(prob)  # the global generator, drawn as CAM draws it
        for h in range(HKV):
            for j, (i, win) in enumerate(zip(merging, windows, strict=True)):
                for t in win:
                    self.v[h][t] = self.v[h][t] + float(mask[0, h, j]) * self.v[h][i] / len(win)
        for name in ("k", "v", "a"):
            setattr(self, name, [[getattr(self, name)[h][i] for i in kept] for h in range(HKV)])
        self.pos = [self.pos[i] for i in kept]
        self.steps = 0


@pytest.mark.parametrize(
    ("prompt", "target", "interval", "budget"), [(14, 6, 1, 3), (9, 7, 3, 2), (12, 5, 2, 32)]
)
def test_cam_merges_evicted_values_into_the_next_kept_tokens_with_bernoulli_draws(
    prompt, target, interval, budget
):
    """Prefill then 8 decode steps whose attention is given; the same global draws on both sides."""
    keys, values, query = tensors(prompt + 8, seed=7)
    gen = torch.Generator().manual_seed(1)
    probs = [torch.rand(1, HKV, prompt + s + 1, generator=gen) for s in range(8)]
    method = CAM(scorer=KNorm(), compression_interval=interval, merge_budget=budget, seed=None)
    torch.manual_seed(0)
    layer = prefilled(method, keys[:, :, :prompt], values[:, :, :prompt], query[:, :, :prompt], target)
    torch.manual_seed(0)
    last = attention(keys[:, :, :prompt], query[:, :, :prompt])[:, -1].view(HKV, GROUP, prompt).mean(1)
    ref = CamReference(keys[:, :, :prompt], values[:, :, :prompt], last, target, interval, budget)
    merged = False
    for s in range(8):
        i = prompt + s
        layer.update(keys[:, :, i : i + 1], values[:, :, i : i + 1])
        p = probs[s][..., : layer.store.n_slots]
        state = torch.get_rng_state()  # both sides draw from the same global state
        method.decode_step(layer, p)
        torch.set_rng_state(state)
        ref.step(keys[:, :, i : i + 1], values[:, :, i : i + 1], p, i)
        assert layer.store.positions[0, 0].tolist() == ref.pos
        assert layer.store.n_slots <= max(prompt, target) + interval  # memory freed at each compression
        for h in range(HKV):
            torch.testing.assert_close(
                layer.values[0, h].double(), torch.stack(ref.v[h]), atol=1e-5, rtol=1e-5
            )
            attn = torch.tensor(ref.a[h], dtype=torch.float64)
            torch.testing.assert_close(layer.store.state["attn"][0, h].double(), attn, atol=1e-6, rtol=1e-5)
        merged |= not torch.equal(layer.values, values[..., layer.store.positions[0, 0], :])
    assert merged


def test_cam_seeded_draws_repeat_and_options_are_checked():
    keys, values, query = tensors(20, seed=2)
    runs = [prefilled(CAM(seed=3), keys, values, query, 8).values for _ in "ab"]
    torch.testing.assert_close(runs[0], runs[1])
    for bad in ({"compression_interval": 0}, {"merge_budget": 0}):
        with pytest.raises(ValueError):
            CAM(**bad)
