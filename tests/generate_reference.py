"""transformers greedy decoding as the reference for KVBench generation, and the methods that take no budget
(or an allocator) there."""

from __future__ import annotations

import torch

from tests.conftest import set_attn


def hf_greedy(model, ids: torch.Tensor, new: int) -> list[int]:
    """``model.generate`` greedy tokens (stopping at EOS like ours), with stock SDPA attention."""
    set_attn(model, "sdpa")
    try:
        out = model.generate(ids, max_new_tokens=new, do_sample=False)
    finally:
        set_attn(model, "kvbench")
    return out[0, ids.shape[1] :].tolist()


#: methods the budget does not drive (DuoAttention's pattern, DMS's threshold, SimLayerKV's lazy layers
#: decide; ThinK alone prunes key channels, no token): tests/test_allocators.py,
#: tests/test_kvpress_methods.py, tests/test_think.py and the architecture matrix
NO_BUDGET = {"fullkv", "duo_attention", "dms", "simlayerkv", "think"}


def allocator_kwargs(model) -> dict[str, dict]:
    """The allocators over SnapKV (their presets' scorer), per-layer ratios equal for ``model``."""
    from methods import SnapKV

    layers = model.config.num_hidden_layers
    return {
        "adakv": {"scorer": SnapKV()},
        "pyramidkv": {"scorer": SnapKV()},
        "layer_ratios": {"scorer": SnapKV(), "ratios": [1] * layers},
    }
