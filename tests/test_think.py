"""ThinK (methods/think.py): kvpress's channel rule, freed channels decoding as zeroed ones, the bytes
held, and the storage kinds it refuses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from methods import TOVA, AdaKV, FullKV, SnapKV, ThinK
from methods.quant import storage_kind
from methods.seam.uniform import SlotStore
from methods.think import KeptChannels, kept_channels
from runners.generation.greedy import greedy_generate
from tests.method_settings import NEW, prompt


def reference_channels(query: torch.Tensor, keys: torch.Tensor, window: int, ratio: float) -> list[list[set]]:
    """kvpress 0.5.5 ``ThinKPress.compress`` restated per (batch, KV head, channel), in float64: the
    score of channel ``c`` is the mean over the last ``window`` queries and the head's query group of
    ``q_c^2`` times the mean over tokens of ``k_c^2``; the ``int(head_dim x ratio)`` lowest go."""
    b, hq, _, d = query.shape
    h = keys.shape[1]
    g = hq // h
    q, k = query[:, :, -window:].double(), keys.double()
    out = []
    for bi in range(b):
        row = []
        for hi in range(h):
            score = [
                sum(float((q[bi, hi * g + j, :, c] ** 2).mean()) for j in range(g)) / g
                * float((k[bi, hi, :, c] ** 2).mean())
                for c in range(d)
            ]  # fmt: skip
            pruned = sorted(range(d), key=lambda c: score[c])[: int(d * ratio)]
            row.append(set(range(d)) - set(pruned))
        out.append(row)
    return out


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_kept_channels_are_kvpress_rule(ratio):
    g = torch.Generator().manual_seed(0)
    query, keys = torch.randn(2, 6, 40, 16, generator=g), torch.randn(2, 2, 30, 16, generator=g)
    keys = keys * torch.rand(1, 1, 1, 16, generator=g) * 3  # channels of uneven magnitude
    tokens = torch.full((2, 2), 30)
    ours = kept_channels(query, keys, tokens, 32, int(16 * ratio))
    assert [[set(h) for h in row] for row in ours.tolist()] == reference_channels(query, keys, 32, ratio)


def test_ragged_heads_rank_over_their_own_tokens():
    """Zero padding past a head's count leaves the mean over its held tokens."""
    g = torch.Generator().manual_seed(1)
    query, keys = torch.randn(1, 4, 10, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)
    padded = keys.clone()
    padded[0, 1, 7:] = 0
    ours = kept_channels(query, padded, torch.tensor([[12, 7]]), 32, 4)
    assert [set(h) for h in ours[0].tolist()] == [
        reference_channels(query, keys, 32, 0.5)[0][0],
        reference_channels(query, keys[:, :, :7], 32, 0.5)[0][1],
    ]


@dataclass(frozen=True, eq=False)
class ZeroedChannels:
    """kvpress's storage: keys at full width, the pruned channels set to zero (a codec)."""

    keep: torch.Tensor  # [batch, kv_heads, head_dim] 1 on kept channels

    def encode(self, name, x):  # [batch, kv_heads, k, head_dim], or one row per ragged segment
        keep = self.keep.unsqueeze(2) if x.dim() == 4 else self.keep.flatten(0, 1)
        return {name: x * keep if name == "keys" else x}

    def decode(self, name, fields):
        return fields[name]


@dataclass
class ZeroedThinK(ThinK):
    """ThinK as kvpress stores it (no memory saved): the same channels, zeroed at full width, and the
    whole query (every key appended after compression zeroed as well: ours holds those on the kept
    channels too)."""

    def prefill(self, layer, query, scaling):
        self.press.prefill(layer, query, scaling)
        keys = layer.keys
        kept = kept_channels(query, keys, layer.store.head_slots(), self.window_size, self.n_pruned(16))
        keep = torch.zeros(keys.shape[:2] + keys.shape[-1:]).scatter_(-1, kept, 1.0)
        layer.store.write("keys", keys * keep.unsqueeze(2))
        layer.store.codec = ZeroedChannels(keep)  # the keys appended from now on

    def decode_attention(self, layer, query, scaling):
        return self.press.decode_attention(layer, query, scaling)


def logits_of(model, method, budget):
    """Greedy tokens and the logits of every forward's last position."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out[0, -1].clone()))
    try:
        res = greedy_generate(model, prompt(5), method, budget, NEW, set())
    finally:
        hook.remove()
    return res, torch.stack(seen)


@pytest.mark.parametrize(
    ("press", "budget"),
    [(FullKV(), None), (SnapKV(window_size=4), 20), (AdaKV(scorer=TOVA()), 20)],
    ids=["alone", "snapkv", "adakv-ragged"],
)
def test_freed_channels_decode_as_zeroed_ones(tiny_model, press, budget):
    """The kept channels held alone, with the query projected, give the tokens and logits of the
    pruned channels zeroed in full-width storage (kvpress's semantics); the keys are really narrower."""
    ours, ours_logits = logits_of(tiny_model, ThinK(press=press, window_size=8), budget)
    zeroed, zeroed_logits = logits_of(tiny_model, ZeroedThinK(press=press, window_size=8), budget)
    assert ours.tokens == zeroed.tokens
    torch.testing.assert_close(ours_logits, zeroed_logits, rtol=1e-5, atol=1e-5)
    assert ours.kv_bytes * 4 == zeroed.kv_bytes * 3  # keys on 8 of 16 channels, values whole


def test_kv_bytes_are_half_the_keys_plus_the_values(tiny_model):
    """ThinK 0.5: FullKV's keys x 0.5 + its values; SnapKV + ThinK 0.5: SnapKV's likewise (K and V have
    the same width here: 3/4 of the bytes)."""
    held = {}
    for name, method, budget in (
        ("fullkv", FullKV(), None),
        ("think", ThinK(window_size=8), None),
        ("snapkv", SnapKV(window_size=4), 20),
        ("think_snapkv", ThinK(press=SnapKV(window_size=4), window_size=8), 20),
    ):
        res = greedy_generate(tiny_model, prompt(6), method, budget, NEW, set())
        held[name] = res.kv_bytes
        assert res.fullkv_bytes == held["fullkv"]  # the uncompressed reference stays whole-width
    assert held["think"] == held["fullkv"] // 2 // 2 + held["fullkv"] // 2
    assert held["think_snapkv"] == held["snapkv"] // 2 // 2 + held["snapkv"] // 2


def test_the_store_holds_keys_on_the_kept_channels(tiny_model):
    seen = []
    greedy_generate(tiny_model, prompt(0), ThinK(window_size=8), None, 2, set(), seen.append)
    for layer in seen[-1].layers:
        assert isinstance(layer.store.codec, KeptChannels)
        assert layer.store.buffers["keys"].shape[-1] == 8 and layer.store.buffers["values"].shape[-1] == 16


@pytest.mark.parametrize("kind", ["kivi2", "kivi4"])
def test_kivi_is_refused_before_loading(kind):
    store = storage_kind(kind, {"group": 4, "residual": 8})({}, lambda needed: needed)
    with pytest.raises(ValueError, match="per-token codec"):
        ThinK().check_storage(store)
    ThinK().check_storage(SlotStore({}, lambda needed: needed))  # quant=none, int8, int4: held


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key_channel_compression_ratio": 1.0},
        {"key_channel_compression_ratio": -0.1},
        {"window_size": 0},
        {"press": ThinK()},
        {"press": SnapKV(), "window_size": True},
    ],
)
def test_bad_options_are_refused(kwargs):
    with pytest.raises(ValueError):
        ThinK(**kwargs)


def test_rerotating_streamingllm_is_refused_and_labels_name_the_inner_method():
    from methods import KeyRerotation, StreamingLLM

    with pytest.raises(ValueError, match="re-rotates"):
        ThinK(press=StreamingLLM())
    assert ThinK(press=StreamingLLM(rerotate=False)).label == "think_streamingllm"
    assert ThinK(press=KeyRerotation(scorer=TOVA())).label == "think_key_rerotation_tova"  # turns at prefill
    assert ThinK().label == "think" and ThinK(press=SnapKV()).label == "think_snapkv"
