"""What the method tests share on the tiny random Llama (2 layers, 6 query / 2 KV heads, head_dim 16):
every registered method's mild and harsh settings (``SETTINGS``, ``CASES``), the prompts, the presets
of configs/method built as the runners build them, a run with a spied method, the bytes of a slot,
and LESS's random kernels of that geometry."""

from __future__ import annotations

import pytest
import torch

from methods import METHOD_REGISTRY, TOVA, AdaKV, KNorm, SnapKV
from methods.kvzip_prompt import ReconstructionPrompt
from methods.less.kernels import LessKernels
from runners.generation.greedy import greedy_generate
from tests.conftest import REPO

B, HQ, HKV, D, R = 1, 6, 2, 16, 8
SCALE = D**-0.5


def tiny_kernels(layers: int = 2, scale: float = 1.0) -> list[LessKernels]:
    """Random kernels for the tiny test Llama; ``scale`` sets |D| (0 gives psi = 0: a zero state)."""
    kernels = [LessKernels(HQ, HKV, D, rank=R, hidden=32) for _ in range(layers)]
    with torch.no_grad():
        for k in kernels:
            k.d.fill_(scale)
            k.d2.fill_(0.5 * scale)
    return kernels


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


def prompt(seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


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


def generate_spied(model, spy, name: str, kwargs: dict, budget: int) -> dict[int, list]:
    """Generate ``NEW`` tokens with ``spy(METHOD_REGISTRY[name], records)(**kwargs)`` at ``budget``;
    assert the budget holds after the prefill and every step; return the spy's records."""
    records: dict[int, list] = {}
    sizes = []
    method = spy(METHOD_REGISTRY[name], records)(**kwargs)
    greedy_generate(model, prompt(4), method, budget, NEW, set(), lambda c: sizes.append(max(c.n_slots)))
    assert len(sizes) == NEW and max(sizes) <= budget
    return records
