"""One shared matrix: every method x a mild and a harsh setting, checked against invariants
on a tiny random GQA Llama (budget never exceeded, bytes match slots, a covering budget gives
FullKV's output, determinism)."""

from __future__ import annotations

import pytest
import torch

from methods import METHOD_REGISTRY, TOVA, AdaKV, FullKV, KNorm, SnapKV
from methods.kvzip_prompt import ReconstructionPrompt
from runners.generation.greedy import greedy_generate
from tests.conftest import REPO
from tests.test_less import tiny_kernels

PROMPT, NEW = 64, 16
BYTES_PER_SLOT = 2 * 2 * 16 * 4  # kv_heads x head_dim x (K, V) x fp32, one layer
PATTERN = str(REPO / "tests" / "data" / "duo_pattern_2x2.tsv")  # DuoAttention's gates, 2 layers x 2 heads
#: KVzip's reconstruction prompt in a tiny vocabulary (the runners read it from the tokenizer)
TINY_PROMPT = ReconstructionPrompt(head=(), repeat=(5, 6, 7, 8), resume=(5, 6, 7, 9), tail=(10,))

SETTINGS = {
    "fullkv": ({}, {}),
    "zsmerge": ({}, {"alpha": 0.5, "residual_ratio": 3, "order": "paper", "lam": 0.5}),
    "h2o": ({}, {"heavy_ratio": 0.75, "recent_ratio": 0.25, "chunk_size": 7}),
    "snapkv": ({}, {"window_size": 4, "kernel_size": 3, "pooling": "avg", "decode_budget": True}),
    "streamingllm": ({}, {"n_sink": 1, "rerotate": False}),
    # fixed theta makes the slot count an outcome (tests/test_kvmerger.py); the matrix needs a budget
    "keepkv": ({}, {"estimator": "window_mean", "merge": "convex", "threshold": 0.3, "n_sink": 1}),
    # LESS needs trained kernels: random ones with a non-zero state here (tests/test_less.py)
    "less": ({"kernels": tiny_kernels()}, {"policy": "lambda", "kernels": tiny_kernels()}),
    "kvmerger": ({"exact_budget": True}, {"exact_budget": True, "recent_ratio": 0.08, "heavy_ratio": 0.02}),
    "tova": ({}, {"recent": 2}),
    "knorm": ({}, {}),
    "keydiff": ({}, {}),
    "random": ({}, {"seed": 3}),
    # allocators over a scorer (the uniform ones and a decode-time one)
    "adakv": ({"scorer": SnapKV(window_size=4)}, {"scorer": TOVA(), "alpha_safeguard": 0.5}),
    "pyramidkv": ({"scorer": SnapKV(window_size=4)}, {"scorer": KNorm(), "beta": 2}),
    "layer_ratios": (
        {"scorer": SnapKV(window_size=4), "ratios": [1, 1]},
        {"scorer": TOVA(), "ratios": [3, 1]},
    ),
    "duo_attention": (
        {"pattern": PATTERN, "sink_size": 4, "recent_size": 20},
        {"pattern": PATTERN, "sink_size": 2, "recent_size": 6, "sparsity": 0.75},
    ),
    "criticalkv": (
        {},
        {"scorer": SnapKV(window_size=4, kernel_size=3, decode_budget=True), "first_stage_ratio": 0.3},
    ),
    "rkv": ({}, {"window_size": 3, "buffer": 4, "kernel_size": 3}),
    "expected_attention": ({}, {"n_sink": 1, "n_future_positions": 16, "epsilon": 0.02}),
    # the default lag (128) leaves a 64-token prompt unscored (a sliding window): smaller lags here
    "lagkv": ({"lag_size": 16}, {"n_sink": 2, "lag_size": 8, "cross_scoring": True}),
    "observed_attention": ({}, {"chunk_size": 7, "decode_budget": True}),
    "chunkkv": ({"scorer": SnapKV(window_size=4)}, {"scorer": KNorm(), "chunk_length": 3}),
    "block": ({"block_size": 8}, {"scorer": SnapKV(window_size=4), "block_size": 5}),
    # a chunk keeps at least one token: chunks of 16 keep floor(16 x 10/64) = 2 each under budget 10
    "entropy_gated_chunkkv": (
        {"scorer": SnapKV(window_size=4)},
        {"scorer": KNorm(), "chunk_length": 3, "low_entropy_chunk_length": 1},
    ),
    "finch": ({"window_size": 4}, {"window_size": 2, "chunk_length": 16}),  # no question here: a fixed window
    "chunk": ({"chunk_length": 24}, {"scorer": SnapKV(window_size=2), "chunk_length": 16}),
    "leverage_score": ({}, {"sketch_dimension": 8, "seed": 1}),
    "non_causal_attn": ({}, {"chunk_size": 24}),
    "compactor": (
        {},
        {"sink_size_start": 2, "sink_size_end": 1, "chunk_size": 24, "sketch_dimension": 8, "seed": 1},
    ),
    "cap": ({}, {"n_sink": 1, "n_future_positions": 16, "tau": 1.0}),
    "cur": ({}, {"num_sinks": 1, "leverage_type": "kv_avg", "local_window_size": 5}),
    "merging": ({}, {"scorer": SnapKV(window_size=4), "similarity_threshold": 0.2, "merge_fraction": 0.5}),
    "cam": ({}, {"scorer": TOVA(), "merge_budget": 2}),
    # the kept fraction is an outcome: settings that evict (KNorm: ragged heads; TOVA: the same per head)
    "dms": (
        {"scorer": KNorm(), "threshold": -11.7, "sliding_window_size": 16},
        {"scorer": TOVA(), "threshold": 0.03, "sliding_window_size": 4},  # 36 candidates: some below 1/36
    ),
    "simlayerkv": (  # one lazy layer of two at 0.2, both at 0
        {"lazy_threshold": 0.2, "n_recent": 16, "n_initial": 2},
        {"lazy_threshold": 0.0, "n_recent": 6, "n_initial": 1, "n_last": 2},
    ),
    "key_rerotation": ({"scorer": TOVA(recent=2)}, {"scorer": AdaKV(scorer=SnapKV(window_size=4))}),
    # key channels pruned over a sequence method: uniform heads, then ragged ones (AdaKV)
    "think": (
        {"press": SnapKV(window_size=4), "window_size": 8},
        {"press": AdaKV(scorer=TOVA()), "key_channel_compression_ratio": 0.75, "window_size": 4},
    ),
    # the budget shared by every layer and head; then each layer's heads, three reconstruction chunks, KVzip+
    "kvzip": (
        {"prompt": TINY_PROMPT},
        {
            "prompt": TINY_PROMPT,
            "layerwise": True,
            "n_sink": 1,
            "chunk_size": 24,
            "resume_tokens": 3,
            "kvzip_plus_normalization": True,
        },
    ),
    # KVzip's reconstruction with a backward pass per chunk; then each layer's heads, kvpress's selection
    "kvgrad": (
        {"prompt": TINY_PROMPT, "chunk_size": 24},
        {
            "prompt": TINY_PROMPT,
            "layerwise": True,
            "n_sink": 1,
            "chunk_size": 16,
            "resume_tokens": 3,
            "keep_head": False,
            "count_pairs": True,
        },
    ),
    # counts shared across layers: composites (one count per layer), then ragged heads with other options
    "kvcompose": (
        {},
        {"structured": False, "agg_task": "mean", "agg_group": "max", "keep_token_lower_bound": 2},
    ),
}
CASES = [
    pytest.param(name, kwargs, budget, id=f"{name}-{level}")
    for name, pair in SETTINGS.items()
    for level, kwargs, budget in (("mild", pair[0], 40), ("harsh", pair[1], 10))
]


def test_every_registered_method_is_in_the_matrix():
    assert set(SETTINGS) == set(METHOD_REGISTRY)


def prompt(seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_budget_and_memory_at_every_step(tiny_model, name, kwargs, budget):
    method = METHOD_REGISTRY[name](**kwargs)
    steps = []

    pooled = getattr(method, "layerwise", True) is False  # KVzip: one budget over every layer and head

    def check(cache) -> None:
        steps.append(cache.n_slots)
        held, allowed = [], []
        for layer in cache.layers:  # the layer's own budget (layer allocators), mean over its heads
            allowed.append(PROMPT + len(steps) - 1)
            if method.traits.budget_applies:
                allowed[-1] = layer.budget + (0 if method.traits.holds_in_decode else len(steps) - 1)
            held.append(layer.store.head_slots().float().mean())
            assert held[-1] <= allowed[-1] or pooled
        assert sum(held) <= sum(allowed)
        state = sum(t.nbytes for layer in cache.layers for t in layer.aux.values())  # LESS's H, z
        held = sum(  # over every head, at the held widths (ThinK's keys: their kept channels)
            int(layer.store.head_slots().sum()) * (layer.keys.shape[-1] + layer.values.shape[-1]) * 4
            for layer in cache.layers
        )
        assert cache.kv_bytes() == held + state

    res = greedy_generate(
        tiny_model, prompt(0), method, budget if method.traits.compresses else None, NEW, set(), check
    )
    assert len(steps) == NEW
    if method.traits.compresses:
        assert res.kv_bytes < res.fullkv_bytes  # memory was really released


PROMPT_ONLY = [
    pytest.param(name, kwargs, id=name)
    for name, (kwargs, _) in SETTINGS.items()
    if METHOD_REGISTRY[name](**kwargs).traits.holds_in_decode
]


@pytest.mark.parametrize(("name", "kwargs"), PROMPT_ONLY)
def test_prompt_only_rule_compresses_the_prompt_once_and_keeps_every_decoded_token(tiny_model, name, kwargs):
    """``decode_budget=false`` on every method with a decode-time rule: the prompt is compressed to
    the budget (the layer's own budget for layer allocators), then every decoded token is kept."""
    method = METHOD_REGISTRY[name](**kwargs, decode_budget=False)
    assert method.traits.prompt_only and not method.traits.holds_in_decode
    held: list[list[float]] = []

    def check(cache) -> None:
        held.append([float(layer.store.head_slots().float().mean()) for layer in cache.layers])
        for layer in cache.layers:
            assert held[0][cache.layers.index(layer)] <= layer.budget

    greedy_generate(tiny_model, prompt(0), method, 10, NEW, set(), check)
    for step, slots in enumerate(held):
        assert slots == [s + step for s in held[0]], f"step {step}: a decoded token was evicted"


@pytest.fixture(scope="module")
def fullkv_tokens(tiny_model) -> list[int]:
    """FullKV's greedy tokens on ``prompt(1)``: what every method must give at a covering budget."""
    return greedy_generate(tiny_model, prompt(1), FullKV(), None, NEW, set()).tokens


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_covering_budget_gives_fullkv_output(tiny_model, fullkv_tokens, name, kwargs, budget):
    method = METHOD_REGISTRY[name](**kwargs)
    if not method.traits.budget_applies:
        pytest.skip("the budget does not drive it (DuoAttention: tests/test_allocators.py, sparsity 0)")
    if getattr(method, "key_channel_compression_ratio", 0):
        pytest.skip("ThinK prunes key channels at any token budget (tests/test_think.py)")
    covering = PROMPT + NEW if method.traits.holds_in_decode else PROMPT
    ratios = kwargs.get("ratios")
    if ratios:  # every layer's share must cover the prompt
        covering = -(-covering * sum(ratios) // (len(ratios) * min(ratios)))
    out = greedy_generate(tiny_model, prompt(1), METHOD_REGISTRY[name](**kwargs), covering, NEW, set()).tokens
    assert out == fullkv_tokens


@pytest.mark.parametrize(("name", "kwargs", "budget"), CASES)
def test_same_input_same_output(tiny_model, name, kwargs, budget):
    runs = [
        greedy_generate(tiny_model, prompt(2), METHOD_REGISTRY[name](**kwargs), budget, NEW, set())
        for _ in "ab"
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].slots == runs[1].slots


def preset_names() -> list[str]:
    return sorted(p.stem for p in (REPO / "configs" / "method").glob("*.yaml"))


def build_preset(name: str):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"method={name}"])
    if cfg.method.get("checkpoint", "") is None:  # trained LESS kernels: random ones of this geometry
        cfg.method.checkpoint = "random"
    from omegaconf import OmegaConf

    for key, value in (("pattern", PATTERN), ("ratios", [2, 1])):  # what a user must give
        if key in cfg.method.keys() and OmegaConf.is_missing(cfg.method, key):
            cfg.method[key] = value
    method = instantiate(cfg.method)
    if method.traits.probes:  # what the runners read from the tokenizer (runners.setup.build.build_method)
        method.prompt = TINY_PROMPT
    return method


def slot_bytes(layer) -> int:
    """Bytes one slot occupies in every per-slot tensor of the layer (K, V, log-weight, positions, state)."""
    return sum(t.element_size() * t[:, :, :1].numel() for t in layer.store.buffers.values())


@pytest.mark.parametrize("budget", [10, 40, 4096])
@pytest.mark.parametrize("preset", preset_names())
def test_allocated_memory_never_exceeds_the_bound_plus_one_slot(tiny_model, preset, budget):
    """Buffers hold at most ``min(plan.bound + 1, prompt + new)`` slots (the bound plus the appended
    slot), and an unbounded layer what it holds plus the tokens still to come (a prompt-only method
    frees what it evicted), for every method and preset, at every step; ragged heads their own slots
    plus what each may still receive; a budget far above the prompt allocates nothing it cannot use."""
    method = build_preset(preset)
    budget = budget if method.traits.budget_applies else None
    seen = PROMPT + NEW - 1  # tokens ever appended

    def check(cache) -> None:
        for layer in cache.layers:
            to_come = seen - layer.get_seq_length()
            if layer.store.kind == "ragged":  # the heads' own slots and what each may still receive
                r = layer.store
                room = torch.where(r.grows, r.lengths + to_come, r.bounds + 1).sum()
                index = 2 * r.segment.nbytes + 3 * r.offsets.nbytes
                assert (
                    layer.store.allocated_bytes()
                    <= room * sum(t[:1].nbytes for t in r.buffers.values()) + index
                )
                continue
            bound = layer.plan.bound
            # an unbounded layer: what it holds plus the tokens still to come (no more)
            slots = min(seen, layer.store.n_slots + to_come) if bound is None else min(bound + 1, seen)
            aux = sum(t.untyped_storage().nbytes() for t in layer.aux.values())
            assert layer.store.allocated_bytes() <= slots * slot_bytes(layer) + aux, (
                layer.spec.layer_idx,
                layer.store.n_slots,
            )
            if bound is not None:
                assert layer.store.n_slots <= bound

    greedy_generate(tiny_model, prompt(5), method, budget, NEW, set(), check)
