"""``quant=quanto_int4``/``quanto_int2`` against transformers' own ``QuantizedCache`` with the quanto
backend (optimum-quanto installed): codes bit for bit, the store's reads equal to what the cache layer
hands attention at every update (the residual and its flush rule; after evictions and over ragged heads
for the tokens held), and FullKV's greedy tokens equal to ``model.generate(cache_implementation=
"quantized")`` on a tiny random Llama whose residual flushes more than once."""

from __future__ import annotations

import pytest
import torch

from methods import FullKV
from methods.quant.per_token import PerTokenCodec
from methods.quant.quanto import QuantoRaggedStore, QuantoStore
from runners.generation.greedy import greedy_generate
from tests.architectures import tiny_family
from tests.conftest import set_attn

pytest.importorskip("optimum.quanto", reason="optimum-quanto (the dev extra) is not installed")
from transformers.cache_utils import QuantoQuantizedLayer

H, D = 2, 64
#: Tokens per update: the prompt, then decode steps and chunks (several flushes at every R tested).
UPDATES = [20, 1, 1, 2, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1]


def kv(n: int, seed: int, d: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (channels of different ranges, as real keys have) and values ``[1, H, n, d]``."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, H, n, d, generator=g) * torch.linspace(0.5, 4.0, d)
    return keys, torch.randn(1, H, n, d, generator=g)


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("d", [64, 128])
def test_codes_are_quantos_bit_for_bit(bits, d):
    """PerTokenCodec's dequantized codes equal quanto's (``QuantoQuantizedLayer._quantize`` with axis 0,
    then ``_dequantize``) exactly, and stay equal through repeated re-quantization (each flush)."""
    layer = QuantoQuantizedLayer(nbits=bits, q_group_size=64)
    codec = PerTokenCodec(bits, 64)
    ours = theirs = kv(300, bits, d)[0]
    for _ in range(3):
        ours = codec.decode("k", codec.encode("k", ours))
        theirs = layer._dequantize(layer._quantize(theirs.contiguous(), axis=0))
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("residual", [0, 1, 3])
@pytest.mark.parametrize("layout", ["uniform", "evicted", "ragged"])
def test_reads_are_what_the_quanto_layer_returns(bits, residual, layout):
    """At every update after the prompt the store reads, for each token it holds, exactly what
    ``QuantizedLayer.update`` returns for attention (quantized tokens re-quantized at each flush, the
    residual and the new tokens in full precision); a head's held tokens read the same after an
    eviction (uniform ``keep``) or as ragged heads (one token per update there)."""
    layer = QuantoQuantizedLayer(nbits=bits, q_group_size=64, residual_length=residual)
    store = QuantoStore({}, lambda n: n + 64, bits=bits, group=64, residual=residual)
    updates = UPDATES if layout == "uniform" else [k if i == 0 else 1 for i, k in enumerate(UPDATES)]
    held = [torch.arange(updates[0])] * H  # positions each head holds
    total = 0
    for step, k in enumerate(updates):
        keys, values = kv(k, step)
        ref_keys, ref_values = layer.update(keys, values)
        store.append(keys, values, torch.arange(total, total + k))
        total += k
        if step == 0 and layout != "uniform":  # a head-dependent selection of the prompt
            keep = torch.rand(1, H, k, generator=torch.Generator().manual_seed(1)) < 0.6
            keep[..., :2] = True
            if layout == "ragged":
                store = store.ragged(keep)
                assert isinstance(store, QuantoRaggedStore)
            else:
                keep[:, 1] = keep[:, 0]  # a uniform store holds one count per head
                store.keep(keep[0, 0].nonzero().view(1, 1, -1).expand(1, H, -1))
            held = [keep[0, h].nonzero().view(-1) for h in range(H)]
            continue
        if step == 0:
            continue
        held = [torch.cat([held[h], torch.arange(total - k, total)]) for h in range(H)]
        for h in range(H):
            n = len(held[h])
            assert torch.equal(store.keys[0, h, :n], ref_keys[0, h, held[h]]), (step, h)
            assert torch.equal(store.values[0, h, :n], ref_values[0, h, held[h]]), (step, h)
            assert torch.equal(store.positions[0, h, :n], held[h])


def test_bytes_count_codes_and_residual_rows():
    """20 prompt tokens quantized, then 3 in the residual (R = 4): codes, scale and zero point of a
    key and a value per quantized slot (4 bits, head_dim 64: 32 + 2 x 4 bytes each), two fp32 rows
    per residual slot, an int32 row per slot; after the flush every slot is quantized."""
    store = QuantoStore({}, lambda n: n + 8, bits=4, group=64, residual=4)
    store.append(*kv(20, 0), torch.arange(20))
    for t in range(3):
        store.append(*kv(1, t + 1), torch.tensor([20 + t]))
    code, row = 2 * (32 + 8), 2 * D * 4
    assert store.kv_bytes() == H * (20 * code + 3 * row + 23 * 4)
    store.append(*kv(1, 9), torch.tensor([23]))  # the residual reaches R: flushed at the next append
    store.append(*kv(1, 10), torch.tensor([24]))
    assert store.kv_bytes() == H * (24 * code + 1 * row + 25 * 4)


@pytest.mark.parametrize("bits", [4, 2])
def test_options_refused(bits):
    with pytest.raises(ValueError, match="bits"):
        QuantoStore({}, lambda n: n, bits=8)
    with pytest.raises(ValueError, match="residual"):
        QuantoStore({}, lambda n: n, bits=bits, residual=-1)
    with pytest.raises(ValueError, match="divides head_dim"):
        QuantoStore({}, lambda n: n, bits=bits, group=64).append(*kv(4, 0, 32), torch.arange(4))


@pytest.fixture(scope="module")
def llama64():
    """A tiny random Llama with head_dim 64 (one quanto group per token and head), no EOS (full length)."""
    sizes = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}
    return tiny_family("llama", **sizes, num_hidden_layers=2, eos_token_id=None)


#: New tokens by residual length: R = 128 flushes at the 128th and the 256th, R = 1 at every one.
NEW = {1: 40, 128: 260}


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("residual", [1, 128])
def test_fullkv_generates_the_tokens_of_transformers_quantized_cache(llama64, bits, residual):
    ids = torch.randint(3, llama64.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(bits))
    kind = {"bits": bits, "group": 64, "residual": residual}
    ours = greedy_generate(
        llama64, ids, FullKV(), None, NEW[residual], set(), storage=lambda f, c: QuantoStore(f, c, **kind)
    ).tokens
    set_attn(llama64, "sdpa")
    try:
        config = {"backend": "quanto", "nbits": bits, "q_group_size": 64, "residual_length": residual}
        out = llama64.generate(
            ids,
            attention_mask=torch.ones_like(ids),  # no token taken for padding
            max_new_tokens=NEW[residual],
            do_sample=False,
            cache_implementation="quantized",
            cache_config=config,
        )
    finally:
        set_attn(llama64, "kvbench")
    assert ours == out[0, ids.shape[1] :].tolist()
    assert len(ours) == NEW[residual] and len(set(ours)) > 3  # not a constant stream
