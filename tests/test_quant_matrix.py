"""Every registered storage kind (``quant=``, ``methods.quant.QUANT_REGISTRY``) x every method: the
method's budget holds at every step, the layers really hold codes, the bytes are what the codec holds
for the held slots (KIVI: codes, scales, zero points, references and full-precision rows), and
head-adaptive allocators hold their ragged heads in the same codec. A new kind is tested here by
registering it, with no edit of this file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from methods import METHOD_REGISTRY
from methods.quant import QUANT_REGISTRY, storage_kind
from methods.quant.kivi import KiviStore
from methods.quant.quanto import ROW
from methods.seam.ragged import RaggedStore
from methods.seam.uniform import SlotStore
from runners.generation.greedy import greedy_generate
from tests.method_settings import NEW, PROMPT, SETTINGS, prompt

HEAD_DIM, KV_HEADS, FP32 = 16, 2, 4
CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "quant"
#: Parameters shrunk for the tiny model (head_dim 16, 64-token prompts, 16 decode steps): groups of 4
#: channels or tokens and KIVI's residual of 8, so that key blocks are quantized and residuals move.
SMALL = {"group": 4, "residual": 8}


def params(name: str) -> dict:
    """The config's parameters of ``quant=<name>``, shrunk as :data:`SMALL` says."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{name}.yaml"))
    return {k: SMALL.get(k, v) for k, v in cfg.items() if k != "name"}


#: Every registered kind but full precision, made from its config.
KINDS = {name: storage_kind(name, params(name)) for name in sorted(QUANT_REGISTRY) if name != "none"}


def slot_bytes(store) -> int:
    """Bytes the codec holds for one token of one head (its fields for a key and a value)."""
    rows = {"keys": torch.randn(1, store.keys.shape[-1]), "values": torch.randn(1, HEAD_DIM)}  # ThinK: kept
    return sum(t.nbytes for name, row in rows.items() for t in store.codec.encode(name, row).values())


def kivi_bytes(store) -> int:
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


def quanto_bytes(store) -> int:
    """quanto kinds' bytes counted head by head: codes of a quantized slot, two full-precision rows of a
    residual one, the int32 row of every slot."""
    rows, lengths = store.view(ROW), store.head_slots()
    total = 0
    for b, h in lengths.nonzero().tolist():
        ref = rows[b, h, : lengths[b, h]]
        res = int((ref >= 0).sum())
        total += (len(ref) - res) * slot_bytes(store) + res * 2 * HEAD_DIM * FP32 + len(ref) * 4
    return total


CASES = [
    pytest.param(kind, name, kwargs, budget, id=f"{kind}-{name}-{level}")
    for kind in KINDS
    for name, pair in SETTINGS.items()
    for level, kwargs, budget in (("mild", pair[0], 40), ("harsh", pair[1], 10))
]


@pytest.mark.parametrize(("kind", "name", "kwargs", "budget"), CASES)
def test_budget_and_bytes_at_every_step(tiny_model, kind, name, kwargs, budget):
    method = METHOD_REGISTRY[name](**kwargs)
    try:
        method.check_storage(KINDS[kind]({}, lambda needed: needed))
    except ValueError:  # refused before loading (runners.setup.quant_kind): ThinK over KIVI
        pytest.skip(f"{name} refuses quant={kind} (tests/test_think.py)")
    steps, kinds = [], set()
    pooled = getattr(method, "layerwise", True) is False

    def check(cache) -> None:
        steps.append(cache.n_slots)
        for layer in cache.layers:
            store = layer.store
            kinds.add(type(store))
            assert "keys" not in store.buffers and "values" not in store.buffers  # codes
            assert all(f.startswith(("keys.", "values.")) or f == ROW for f in store.kv_fields)
            allowed = PROMPT + len(steps) - 1
            if method.traits.budget_applies:
                allowed = layer.budget + (0 if method.traits.holds_in_decode else len(steps) - 1)
            assert store.head_slots().float().mean() <= allowed or pooled  # the layer's mean over heads
            held = int(store.head_slots().sum())
            if "keys.ref" in store.buffers:  # KIVI, the stateful codec
                assert store.kv_bytes() == kivi_bytes(store)
            elif ROW in store.buffers:  # quanto: full-precision residual rows, an int32 row per slot
                assert store.kv_bytes() == quanto_bytes(store)
            else:
                assert store.kv_bytes() == held * slot_bytes(store)
            assert store.token_bytes() == KV_HEADS * 2 * HEAD_DIM * FP32  # FullKV's bytes per token
        state = sum(t.nbytes for layer in cache.layers for t in layer.aux.values())
        assert cache.kv_bytes() == sum(layer.store.kv_bytes() for layer in cache.layers) + state

    res = greedy_generate(
        tiny_model, prompt(0), method, budget if method.traits.compresses else None, NEW, set(), check,
        storage=KINDS[kind],
    )  # fmt: skip
    assert len(steps) == NEW
    assert res.kv_bytes < res.fullkv_bytes  # codes: less than the uncompressed cache, even for FullKV
    # SimLayerKV goes ragged in a lazy layer only; it reads 2-bit keys, on which no layer is lazy here
    lazy = name != "simlayerkv" or kind != "quanto_int2"
    if method.traits.ragged_heads and budget == 40 and lazy:  # head-adaptive: ragged heads, same codec
        assert any(issubclass(k, RaggedStore) for k in kinds)  # (DMS's harsh setting keeps one count
        # per head: no swap)


@pytest.mark.parametrize("kind", sorted(QUANT_REGISTRY))
def test_every_kind_hands_its_codec_to_ragged_heads(kind):
    """A kind's uniform store made ragged reads back the kept slots as they were: the codes are packed
    as they are (no token encoded twice), so ragged heads read what the uniform store read."""
    store = storage_kind(kind, params(kind) if kind != "none" else {})({}, lambda n: n + 4)
    store.append(torch.randn(1, 2, 24, HEAD_DIM), torch.randn(1, 2, 24, HEAD_DIM), torch.arange(24))
    keep = torch.rand(1, 2, 24, generator=torch.Generator().manual_seed(0)) < 0.6
    keep[..., :2] = True
    before = {name: store.view(name) for name in ("keys", "values", "positions")}
    ragged = store.ragged(keep)
    assert ragged.codec is store.codec
    for name, full in before.items():
        view = ragged.view(name)
        for h in range(2):
            kept = full[0, h][keep[0, h]]
            assert torch.equal(view[0, h, : len(kept)], kept), (kind, name, h)


def test_registry_has_every_config_and_takes_its_parameters():
    assert set(QUANT_REGISTRY) == {p.stem for p in CONFIGS.glob("*.yaml")}
    assert storage_kind("none", {}) is SlotStore
    store = storage_kind("kivi4", {"bits": 4, "group": 32, "residual": 128})({}, lambda n: n)
    assert (store.bits, store.group, store.residual) == (4, 32, 128)
    with pytest.raises(ValueError, match="multiple"):
        storage_kind("kivi2", {"bits": 2, "group": 32, "residual": 100})
    with pytest.raises(ValueError, match="bits"):
        storage_kind("int4", {"bits": 3, "group": 64})
    with pytest.raises(ValueError, match="no parameters"):
        storage_kind("none", {"bits": 8})


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
