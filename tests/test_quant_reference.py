"""Quantized storage against references written elsewhere: the per-token kinds against transformers'
``QuantizedCache`` with the quanto backend (int4 and int2), KIVI against its equations (arXiv
2402.02750, Sec. 3: keys per channel in groups of G tokens, values per token in groups of G channels,
the R most recent tokens in full precision); codes packed, and kept as they are by eviction."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.cache_utils import QuantizedCache

from methods.quant import codes as q
from methods.quant.kivi import KiviStore
from methods.quant.per_token import PerTokenCodec
from methods.seam.uniform import SlotStore

B, H, D = 1, 2, 64


def tokens(n: int, seed: int, batch: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.5, 4.0, D)  # channels of different ranges, as real keys have
    return torch.randn(batch, H, n, D, generator=g) * scale, torch.randn(batch, H, n, D, generator=g)


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("group", [64, 32])
def test_per_token_codes_are_transformers_quanto_cache(bits, group):
    pytest.importorskip("optimum.quanto", reason="optimum-quanto (the dev extra) is not installed")
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=H, num_key_value_heads=H, hidden_size=H * D)
    cache = QuantizedCache(backend="quanto", config=config, nbits=bits, q_group_size=group, residual_length=4)
    keys, values = tokens(12, 0)
    cache.update(keys, values, 0)  # the prompt is quantized (axis 0: groups along each token's channels)
    ref_keys, ref_values = cache.update(*tokens(1, 1), 0)  # dequantized prompt, then the new token
    store = SlotStore({}, lambda n: n, codec=PerTokenCodec(bits, group))
    store.append(keys, values, torch.arange(12))
    torch.testing.assert_close(store.keys, ref_keys[:, :, :12], rtol=0, atol=1e-5)
    torch.testing.assert_close(store.values, ref_values[:, :, :12], rtol=0, atol=1e-5)
    assert not torch.allclose(store.keys, keys, atol=1e-3)  # really quantized


def asym(x: torch.Tensor, dim: int, bits: int) -> torch.Tensor:
    """KIVI Sec. 3.1: ``Q(X) = round((X - z) / s) s + z`` with ``z = min X`` and
    ``s = (max X - min X) / (2^B - 1)`` over ``dim``."""
    z = x.amin(dim, keepdim=True)
    s = (x.amax(dim, keepdim=True) - z) / (2**bits - 1)
    return ((x - z) / s).round().clamp(0, 2**bits - 1) * s + z


def kivi_keys(x: torch.Tensor, g: int, bits: int) -> torch.Tensor:
    """Per-channel quantization of ``x`` ``[b, h, n, d]`` in groups of ``g`` tokens."""
    return torch.cat([asym(x[:, :, i : i + g], 2, bits) for i in range(0, x.shape[2], g)], 2)


def kivi_values(x: torch.Tensor, g: int, bits: int) -> torch.Tensor:
    """Per-token quantization of ``x`` in groups of ``g`` channels."""
    return torch.cat([asym(x[..., j : j + g], 3, bits) for j in range(0, x.shape[3], g)], 3)


@pytest.mark.parametrize("bits", [2, 4])
def test_kivi_prefill_and_decoding_follow_its_equations(bits):
    g, r, prompt = 8, 16, 37  # L mod R = 5 keys and R values in full precision after the prompt
    keys, values = tokens(prompt + 2 * r, 2)
    store = KiviStore({}, lambda n: n + 2 * r, bits=bits, group=g, residual=r)
    store.append(keys[:, :, :prompt], values[:, :, :prompt], torch.arange(prompt))
    for t in range(prompt, prompt + 2 * r):
        n = t  # tokens held before token t is appended
        flushed = (n // r) * r  # keys quantized: whole blocks of R (Algorithm 1)
        expect_k = torch.cat([kivi_keys(keys[:, :, :flushed], g, bits), keys[:, :, flushed:n]], 2)
        expect_v = torch.cat([kivi_values(values[:, :, : n - r], g, bits), values[:, :, n - r : n]], 2)
        torch.testing.assert_close(store.keys, expect_k, rtol=0, atol=1e-5)
        torch.testing.assert_close(store.values, expect_v, rtol=0, atol=1e-5)
        store.append(keys[:, :, t : t + 1], values[:, :, t : t + 1], torch.tensor([t]))
    assert store.buffers["keys.codes"].dtype == torch.uint8
    assert store.buffers["keys.codes"].shape[-1] == D * bits // 8  # packed: 8 / bits codes a byte


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("prompt", [37, 5])
def test_kivi_reads_in_arrival_order_as_it_reads_any_slots(prompt, bits):
    """While nothing moved a slot, KIVI's keys and values are read by broadcasting each group's scale
    (``KiviReads._read_in_order``) and a leaving value is written to its slot directly: the same
    tensors as a twin store that gathers every slot's group and searches every leaving value's slot, at
    every step through key-block flushes and values leaving the residual."""
    g, r = 8, 16
    keys, values = tokens(prompt + 3 * r, 3, batch=2)
    store, twin = (KiviStore({}, lambda n: n + 3 * r, bits=bits, group=g, residual=r) for _ in range(2))
    for s in (store, twin):
        s.append(keys[:, :, :prompt], values[:, :, :prompt], torch.arange(prompt))
    twin.in_order = False
    for t in range(prompt, prompt + 3 * r):
        for name in ("keys", "values"):
            assert torch.equal(store._read(name), twin._read(name)), (name, t)
        for s in (store, twin):
            s.append(keys[:, :, t : t + 1], values[:, :, t : t + 1], torch.tensor([t]))
    assert store.in_order


@pytest.mark.parametrize("operation", ["keep", "drop", "swap", "reset"])
def test_kivi_reads_after_a_slot_moves_are_the_moved_slots(operation):
    """Every operation that moves or rebuilds slots ends the in-order reading: what is read after it is
    the slots it left (keep, drop, swap: the same dequantized rows, moved), never rows read in place."""
    g, r, n = 8, 16, 40
    keys, values = tokens(n, 4)
    store = KiviStore({}, lambda k: k + 4, bits=2, group=g, residual=r)
    store.append(keys, values, torch.arange(n))
    before = {name: store._read(name) for name in ("keys", "values")}
    order = list(range(n))
    if operation == "keep":
        order = [5, 2, *range(9, n)]
        store.keep(torch.tensor(order).expand(B, H, -1))
    elif operation == "drop":
        store.drop(torch.full((B, H), 3))
        order[3] = order.pop()
    elif operation == "swap":
        store.swap(torch.full((B, H), 0), torch.full((B, H), 20))
        order[0], order[20] = 20, 0
    else:
        kept = [1, 7, *range(12, n)]
        store.reset(
            keys=keys[:, :, kept], values=values[:, :, kept], positions=torch.tensor(kept).expand(B, H, -1)
        )
    assert not store.in_order
    if operation != "reset":  # reset quantizes afresh
        for name in ("keys", "values"):
            assert torch.equal(store._read(name), before[name][:, :, order]), name


@pytest.mark.parametrize(
    "kind", [lambda: SlotStore({}, lambda n: n, codec=PerTokenCodec(4)), lambda: KiviStore({}, lambda n: n)]
)
def test_eviction_keeps_the_codes(kind):
    """A token is quantized once: keeping or dropping other slots leaves its dequantized value as it was."""
    store = kind()
    store.append(*tokens(300, 3), torch.arange(300))
    before_k, before_v = store.keys, store.values
    index = torch.tensor([3, 140, 200, 290, 7]).expand(B, H, 5)
    store.keep(index)
    torch.testing.assert_close(store.keys, before_k[:, :, [3, 140, 200, 290, 7]], rtol=0, atol=0)
    store.drop(torch.zeros(B, H, dtype=torch.long))  # slot 0 leaves, the last slot takes its place
    torch.testing.assert_close(store.values, before_v[:, :, [7, 140, 200, 290]], rtol=0, atol=0)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.uint8, torch.int64]
)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_packed_codes_read_back_in_every_dtype(bits, dtype):
    """``unpack`` is ``pack``'s inverse in each dtype (floats wider than 2 bytes looked up in bfloat16,
    then widened; one-element table lookups where a dtype is as wide as a byte's codes, rows of codes
    otherwise: int64 at 2 bits): the first code in the low bits."""
    codes = torch.randint(0, 2**bits, (2, 3, 5, 64), generator=torch.Generator().manual_seed(bits))
    packed = q.pack(codes.to(torch.uint8), bits)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == 64 * bits // 8
    assert int(packed[0, 0, 0, 0]) & (2**bits - 1) == int(codes[0, 0, 0, 0])
    torch.testing.assert_close(q.unpack(packed, bits, dtype), codes.to(dtype), rtol=0, atol=0)
