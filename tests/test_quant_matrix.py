"""Quantized storage (``quant=``) x every method: the method's budget holds at every step, the layers
really hold codes, and the bytes are the codes, scales, zero points, references and full-precision
rows of the held slots; head-adaptive allocators hold their ragged heads as codes over every kind (a
kind without ragged heads would refuse them before any work)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from methods import METHOD_REGISTRY
from methods.quant import QUANT_REGISTRY, KiviStore, PerTokenStore, check_method, ragged_parts, storage_kind
from methods.quant.base import QuantizedStore
from methods.quant.kivi_ragged import KiviRaggedStore
from methods.quant.ragged import QuantizedRaggedStore
from methods.seam import cache as seam_cache
from runners.generate import greedy_generate
from tests.test_method_matrix import NEW, PROMPT, SETTINGS, prompt

HEAD_DIM, KV_HEADS, FP32 = 16, 2, 4
#: The kinds over the tiny model (head_dim 16): KIVI with a small G and R, so that its key blocks
#: are quantized and its residuals move during 16 decode steps of a 64-token prompt.
KINDS = {
    "int8": partial(PerTokenStore, bits=8, group=8),
    "int4": partial(PerTokenStore, bits=4, group=8),
    "kivi2": partial(KiviStore, bits=2, group=4, residual=8),
}


def per_token_slot_bytes(bits: int, group: int) -> int:
    """Bytes of one slot of one head: codes, scale and zero point per group, for keys and values."""
    return 2 * (HEAD_DIM * bits // 8 + 2 * (HEAD_DIM // group) * FP32)


def kivi_bytes(store: KiviStore | KiviRaggedStore) -> int:
    """KIVI's bytes counted head by head from the held slots' references: two int32 per slot, codes of a
    quantized key, codes, scale and zero point of a quantized value, a full-precision row of a residual
    key or value, the scale and zero rows of every distinct key group the head refers to."""
    kref, vref, lengths = store.view("keys.ref"), store.view("values.ref"), store.head_slots()
    code, row = HEAD_DIM * store.bits // 8, HEAD_DIM * FP32
    value_q = code + 2 * (HEAD_DIM // store.group) * FP32
    total = 0
    for b, h in lengths.nonzero().tolist():
        k, v = kref[b, h, : lengths[b, h]], vref[b, h, : lengths[b, h]]
        n, kq, vq = len(k), int((k >= 0).sum()), int((v >= 0).sum())
        groups = k[k >= 0].unique().numel()
        total += n * 8 + kq * code + vq * value_q + (2 * n - kq - vq) * row + groups * 2 * row
    return total


def refused(kind: str, name: str, kwargs: dict) -> bool:
    try:
        check_method(METHOD_REGISTRY[name](**kwargs), kind)
    except ValueError:
        return True
    return False


CASES = [
    pytest.param(kind, name, kwargs, budget, id=f"{kind}-{name}-{level}")
    for kind in KINDS
    for name, pair in SETTINGS.items()
    for level, kwargs, budget in (("mild", pair[0], 40), ("harsh", pair[1], 10))
    if not refused(kind, name, kwargs)
]


@pytest.fixture
def storage():
    """Sets the process's storage kind (as ``runners.storage.set_storage`` does) and restores it."""
    before = list(seam_cache.DEFAULT_STORAGE)

    def use(kind) -> None:
        seam_cache.DEFAULT_STORAGE[0] = kind

    yield use
    seam_cache.DEFAULT_STORAGE[:] = before


@pytest.mark.parametrize(("kind", "name", "kwargs", "budget"), CASES)
def test_budget_and_bytes_at_every_step(tiny_model, storage, kind, name, kwargs, budget):
    storage(KINDS[kind])
    method = METHOD_REGISTRY[name](**kwargs)
    steps, kinds = [], set()
    pooled = getattr(method, "layerwise", True) is False

    def check(cache) -> None:
        steps.append(cache.n_slots)
        for layer in cache.layers:
            store = layer.store
            kinds.add(type(store))
            assert isinstance(store, (QuantizedStore, QuantizedRaggedStore, KiviRaggedStore)), type(store)
            assert "keys" not in store.buffers and store.buffers["keys.codes"].dtype == torch.uint8  # codes
            allowed = PROMPT + len(steps) - 1
            if method.traits.budget_applies:
                allowed = layer.budget + (0 if method.traits.holds_in_decode else len(steps) - 1)
            assert store.head_slots().float().mean() <= allowed or pooled  # the layer's mean over heads
            held = int(store.head_slots().sum())
            if isinstance(store, (PerTokenStore, QuantizedRaggedStore)):
                bits, group = store.codec.bits, store.codec.group
                assert store.kv_bytes() == held * per_token_slot_bytes(bits, group)
            else:
                assert store.kv_bytes() == kivi_bytes(store)
            assert store.token_bytes() == KV_HEADS * 2 * HEAD_DIM * FP32  # FullKV's bytes per token
        state = sum(t.nbytes for layer in cache.layers for t in layer.aux.values())
        assert cache.kv_bytes() == sum(layer.store.kv_bytes() for layer in cache.layers) + state

    res = greedy_generate(
        tiny_model, prompt(0), method, budget if method.traits.compresses else None, NEW, set(), check
    )
    assert len(steps) == NEW
    assert res.kv_bytes < res.fullkv_bytes  # codes: less than the uncompressed cache, even for FullKV
    if ragged_parts(method) and budget == 40:  # head-adaptive: ragged heads, as codes (DMS's harsh
        assert kinds & {QuantizedRaggedStore, KiviRaggedStore}  # setting keeps one count per head: no swap)


@pytest.mark.parametrize("kind", ["kivi2", "kivi4", "int8", "int4", "none"])
def test_every_kind_holds_ragged_heads(kind):
    assert not {name for name, pair in SETTINGS.items() if any(refused(kind, name, kw) for kw in pair)}


def test_a_kind_without_ragged_heads_refuses_head_adaptive_allocators(monkeypatch):
    """The check stays for a kind that does not hold ragged heads (the base store refuses the swap)."""
    monkeypatch.setitem(QUANT_REGISTRY, "plain", QuantizedStore)
    assert {name for name, pair in SETTINGS.items() if any(refused("plain", name, kw) for kw in pair)} == {
        "adakv",
        "duo_attention",
        "simlayerkv",
        "kvzip",
        "dms",
        "key_rerotation",
    }
    with pytest.raises(NotImplementedError, match="ragged"):
        QuantizedStore.ragged(KiviStore({}, lambda n: n), torch.ones(1, 1, 1, dtype=torch.bool))


def test_registry_kinds_take_the_config_parameters():
    assert set(QUANT_REGISTRY) == {"none", "int8", "int4", "kivi2", "kivi4"}
    assert storage_kind("none", {}) is None
    store = storage_kind("kivi4", {"bits": 4, "group": 32, "residual": 128})({}, lambda n: n)
    assert (store.bits, store.group, store.residual) == (4, 32, 128)
    with pytest.raises(ValueError, match="multiple"):
        storage_kind("kivi2", {"bits": 2, "group": 32, "residual": 100})
    with pytest.raises(ValueError, match="bits"):
        storage_kind("int4", {"bits": 3, "group": 64})


def test_kivi_bytes_are_the_formula():
    """L = 21 tokens, G = 4, R = 8: keys 16 quantized (4 groups) and 5 residual; values 13
    quantized and 8 residual; then an eviction frees a group, and codes, rows and groups with it."""
    b, h, d, bits, g = 1, 2, 16, 2, 4
    store = KiviStore({}, lambda n: n + 4, bits=bits, group=g, residual=8)
    store.append(torch.randn(b, h, 21, d), torch.randn(b, h, 21, d), torch.arange(21))
    codes, row, value_q = d * bits // 8, d * FP32, d * bits // 8 + 2 * (d // g) * FP32

    def formula(n, kq, vq, groups):
        return b * h * (n * 2 * 4 + kq * codes + vq * value_q + (2 * n - kq - vq) * row + groups * 2 * row)

    assert store.kv_bytes() == formula(21, 16, 13, 4)
    keep = torch.tensor([4, 5, 6, 7, 16, 20]).expand(b, h, 6)  # one key group and the residual keys
    store.keep(keep)
    assert store.kv_bytes() == formula(6, 4, 4, 1)
    assert store.key_scale.shape[2] == 1  # the unreferenced groups are released
