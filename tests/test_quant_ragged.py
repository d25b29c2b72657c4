"""Ragged heads over per-token quantized storage (``methods.quant.ragged``): the kept slots' codes
move as they are, appended and written tokens are quantized once, bytes are the codes, scales and zero
points of the held slots, and decode attention reads the dequantized slots."""

from __future__ import annotations

import pytest
import torch

from methods.quant.per_token import PerTokenCodec, PerTokenStore
from methods.quant.ragged import QuantizedRaggedStore
from methods.seam.contract import Traits

B, H, D, N = 2, 3, 16, 20


def made(bits: int) -> tuple[PerTokenStore, QuantizedRaggedStore, torch.Tensor]:
    """A uniform store of ``N`` random tokens and its ragged heads: each head keeps its own slots, the
    first head bounded at 4 slots, the others growing."""
    g = torch.Generator().manual_seed(bits)
    store = PerTokenStore({}, lambda n: n + 4, bits=bits, group=8)
    store.append(torch.randn(B, H, N, D, generator=g), torch.randn(B, H, N, D, generator=g), torch.arange(N))
    keep = torch.rand(B, H, N, generator=g) < torch.linspace(0.2, 0.9, H).view(1, H, 1)
    keep[..., 0] = True
    bounds = torch.tensor([4, -1, -1]).expand(B, H)
    return store, store.ragged(keep, bounds), keep


def per_head(store: QuantizedRaggedStore, name: str) -> list[torch.Tensor]:
    """Field ``name`` of every (batch, head), its valid slots only."""
    view, lengths = store.view(name), store.head_slots()
    return [view[b, h, : lengths[b, h]] for b in range(B) for h in range(H)]


@pytest.mark.parametrize("bits", [8, 4])
def test_kept_codes_move_as_they_are(bits):
    store, ragged, keep = made(bits)
    assert "keys" not in ragged.buffers and ragged.buffers["keys.codes"].dtype == torch.uint8
    for name in ("keys", "values", *store.code_fields):
        uniform = store.view(name)
        want = [uniform[b, h][keep[b, h]] for b in range(B) for h in range(H)]
        for got, expected in zip(per_head(ragged, name), want, strict=True):
            assert torch.equal(got, expected)  # dequantized keys: the uniform store's, bit for bit


def test_bytes_are_the_codes_of_the_held_slots():
    store, ragged, keep = made(4)
    slot = 2 * (D * 4 // 8 + 2 * (D // 8) * 4)  # codes, scale and zero point of keys and values, fp32
    assert ragged.kv_bytes() == int(keep.sum()) * slot == store.kv_bytes() * int(keep.sum()) // (B * H * N)
    assert ragged.token_bytes() == B * H * 2 * D * 4  # FullKV's bytes per token
    ragged.append(torch.randn(B, H, 1, D), torch.randn(B, H, 1, D), torch.tensor([N]))
    ragged.drop(torch.zeros(B, H, dtype=torch.long), torch.tensor([True, False, False]).expand(B, H))
    assert ragged.kv_bytes() == int(ragged.head_slots().sum()) * slot


def test_an_appended_token_is_quantized_once_and_eviction_moves_codes():
    _, ragged, _ = made(4)
    key, value = torch.randn(B, H, 1, D), torch.randn(B, H, 1, D)
    before = per_head(ragged, "keys.codes")
    ragged.append(key, value, torch.tensor([N]))
    last = ragged.head_slots() - 1
    codec = PerTokenCodec(4, 8)
    want = codec.decode("keys", codec.encode("keys", key))
    for b in range(B):
        for h in range(H):
            assert torch.equal(ragged.keys[b, h, last[b, h]], want[b, h, 0])
    ragged.drop(torch.zeros(B, H, dtype=torch.long), torch.tensor([True, False, False]).expand(B, H))
    after = per_head(ragged, "keys.codes")
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        if i % H == 0:  # slot 0 evicted: the appended token's codes took its place, the rest unchanged
            assert torch.equal(new[1:], old[1:])
        else:
            assert torch.equal(new[:-1], old)


def test_write_quantizes_what_it_writes():
    _, ragged, _ = made(8)
    keys = torch.randn(B, H, ragged.n_slots, D)
    ragged.write("keys", keys)
    codec = PerTokenCodec(8, 8)
    want = codec.decode("keys", codec.encode("keys", keys))
    for b in range(B):
        for h in range(H):
            n = int(ragged.head_slots()[b, h])
            torch.testing.assert_close(ragged.keys[b, h, :n], want[b, h, :n])


def test_decode_attention_reads_the_dequantized_slots():
    _, ragged, _ = made(4)
    query = torch.randn(B, 2 * H, 1, D)
    out, probs = ragged.attend(query, D**-0.5, Traits(decode_input="probs"), None)
    keys, values, lengths = ragged.keys, ragged.values, ragged.head_slots()
    for b in range(B):
        for hq in range(2 * H):
            h, n = hq // 2, int(lengths[b, hq // 2])
            p = torch.softmax(query[b, hq, 0] @ keys[b, h, :n].T * D**-0.5, -1)
            torch.testing.assert_close(out[b, hq, 0], p @ values[b, h, :n])
    assert probs.shape == (B, H, ragged.n_slots)
