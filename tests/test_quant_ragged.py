"""Ragged heads over quantized storage (``methods.seam.ragged`` holding a codec,
``methods.quant.kivi_ragged``): the kept slots' codes move as they are, appended and written tokens
are quantized once, bytes are the codes, scales and zero points of the held slots, decode attention
reads the dequantized slots, and KIVI's residuals and key-block flushes run per head."""

from __future__ import annotations

import pytest
import torch

from methods.quant.kivi import KiviStore
from methods.quant.per_token import PerTokenCodec
from methods.seam.contract import Traits
from methods.seam.ragged import RaggedStore
from methods.seam.uniform import SlotStore

B, H, D, N = 2, 3, 16, 20


def made(bits: int) -> tuple[SlotStore, RaggedStore, torch.Tensor]:
    """A uniform store of ``N`` random tokens and its ragged heads: each head keeps its own slots, the
    first head bounded at 4 slots, the others growing."""
    g = torch.Generator().manual_seed(bits)
    store = SlotStore({}, lambda n: n + 4, codec=PerTokenCodec(bits, 8))
    store.append(torch.randn(B, H, N, D, generator=g), torch.randn(B, H, N, D, generator=g), torch.arange(N))
    keep = torch.rand(B, H, N, generator=g) < torch.linspace(0.2, 0.9, H).view(1, H, 1)
    keep[..., 0] = True
    bounds = torch.tensor([4, -1, -1]).expand(B, H)
    return store, store.ragged(keep, bounds), keep


def per_head(store: RaggedStore, name: str) -> list[torch.Tensor]:
    """Field ``name`` of every (batch, head), its valid slots only."""
    view, lengths = store.view(name), store.head_slots()
    return [view[b, h, : lengths[b, h]] for b in range(B) for h in range(H)]


@pytest.mark.parametrize("bits", [8, 4])
def test_kept_codes_move_as_they_are(bits):
    store, ragged, keep = made(bits)
    assert "keys" not in ragged.buffers and ragged.buffers["keys.codes"].dtype == torch.uint8
    for name in ("keys", "values", *store.kv_fields):
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


G, R = 4, 8  # KIVI over N = 21 tokens: keys 0..15 quantized (4 groups), 16..20 in the key residual


def kivi(keep_count: int | None = None) -> tuple[KiviStore, torch.Tensor, torch.Generator]:
    """A KIVI store of ``N`` random tokens and a keep mask: every head its own slots (``keep_count``
    each, else its own count), the residual keys always kept."""
    g = torch.Generator().manual_seed(5)
    store = KiviStore({}, lambda n: n + 4 * R, bits=2, group=G, residual=R)
    store.append(torch.randn(B, H, N, D, generator=g), torch.randn(B, H, N, D, generator=g), torch.arange(N))
    score = torch.rand(B, H, N, generator=g) + (torch.arange(N) >= 16)
    counts = torch.full((B, H), keep_count) if keep_count else torch.randint(6, N, (B, H), generator=g)
    rank = score.argsort(-1, descending=True).argsort(-1)
    return store, rank < counts.unsqueeze(-1), g


def test_kivi_ragged_heads_are_the_uniform_store_bit_for_bit():
    """Kept slots, 3 R decode steps (two key-block flushes, values leaving the residual): the ragged
    heads' dequantized keys and values and bytes equal the uniform store's that keeps the same slots."""
    store, keep, g = kivi(keep_count=12)
    ragged = store.ragged(keep)
    assert "keys" not in ragged.buffers and ragged.buffers["keys.codes"].dtype == torch.uint8
    store.keep(keep.nonzero()[:, 2].view(B, H, 12))
    for t in range(N, N + 3 * R):
        for name in ("keys", "values"):
            assert torch.equal(ragged.view(name), store.view(name))
        assert ragged.kv_bytes() == store.kv_bytes() and ragged.token_bytes() == store.token_bytes()
        key, value = torch.randn(B, H, 1, D, generator=g), torch.randn(B, H, 1, D, generator=g)
        store.append(key, value, torch.tensor([t]))
        ragged.append(key, value, torch.tensor([t]))


def quantized(x: torch.Tensor, bits: int) -> torch.Tensor:
    """KIVI Sec. 3.1 over the tokens of ``x`` ``[tokens, d]``, per channel: ``z = min``,
    ``s = (max - min) / (2^B - 1)``, ``round((x - z) / s) s + z``."""
    z = x.amin(0)
    s = (x.amax(0) - z) / (2**bits - 1)
    return ((x - z) / s).round().clamp(0, 2**bits - 1) * s + z


def test_kivi_flush_in_a_segment_follows_its_equations():
    """Heads of their own lengths; heads (0, 0) and (1, 1) evict a residual key (arrival 17) before the
    block of arrivals 16..23 is quantized: each head's block keys are per-channel codes over the G
    arrivals of their group that the head still holds; later keys stay in full precision."""
    store, keep, g = kivi()
    ragged = store.ragged(keep)
    keys = {t: store.keys[:, :, t] for t in range(16, N)}
    slot = int((ragged.view("positions")[0, 0] == 17).nonzero())
    ragged.drop(torch.full((B, H), slot), torch.eye(B, H, dtype=torch.bool))
    for t in range(N, 16 + R + 2):
        keys[t] = torch.randn(B, H, D, generator=g)
        ragged.append(keys[t][:, :, None], torch.randn(B, H, 1, D, generator=g), torch.tensor([t]))
    assert ragged.base == 16 + R
    for b in range(B):
        for h in range(H):
            n = int(ragged.head_slots()[b, h])
            pos, got = ragged.view("positions")[b, h, :n].tolist(), ragged.keys[b, h, :n]
            for first in range(16, 16 + R, G):
                held = [t for t in range(first, first + G) if t in pos]
                want = quantized(torch.stack([keys[t][b, h] for t in held]), 2)
                torch.testing.assert_close(got[[pos.index(t) for t in held]], want, rtol=0, atol=1e-5)
            for t in (16 + R, 16 + R + 1):
                assert torch.equal(got[pos.index(t)], keys[t][b, h])  # the new residual
