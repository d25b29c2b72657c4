"""ThinK's kept key channels against kvpress's ``ThinKPress``, per (prompt, layer, KV head), on the models
and prompts of ``scripts/kvpress_kept_sets.py`` (a tiny random Llama, or ``--real``: the embedded
SmolLM2-135M on two XSum articles and two RULER prompts).

kvpress zeroes the pruned channels of the cache's keys; its kept channels are those not zero in every
held key. KVBench's are the ``KeptChannels`` codec's of each layer after the prefill (the keys held on
those channels only). Cases: ``think`` (``ThinKPress(0.5)`` alone) and ``think_snapkv``
(``ComposedPress([SnapKVPress(0.5), ThinKPress(0.5)])``: the channels are ranked over SnapKV's kept
tokens). Prints, per case, the identical channel sets over the total and their Jaccard index.

Usage::

    python scripts/kvpress_think_channels.py --kvpress-python /path/to/kvpress-venv/bin/python [--real]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kvpress_driver as driver  # the models and prompts of the kept-set check


def kvpress_side(out: Path) -> None:
    """kvpress's kept channels under ``out`` (the tiny model's weights and prompts saved there first,
    or the real model and prompts KVBench's side exported)."""
    import kvpress as kp
    from transformers import DynamicCache

    models, prompts = driver.kvpress_inputs(out, ("sdpa",))
    model = models["sdpa"]
    presses = {
        "think": kp.ThinKPress(key_channel_compression_ratio=0.5),
        "think_snapkv": kp.ComposedPress(
            [kp.SnapKVPress(compression_ratio=0.5), kp.ThinKPress(key_channel_compression_ratio=0.5)]
        ),
    }
    result = {}
    for name, press in presses.items():
        result[name] = []
        for ids in prompts:
            cache = DynamicCache()
            with torch.no_grad(), press(model):
                model(ids, past_key_values=cache)
            keys = [layer.keys[0] for layer in cache.layers]  # [kv_heads, tokens, head_dim]
            result[name].append(
                [(k != 0).any(dim=1).nonzero()[:, 1].view(k.shape[0], -1).tolist() for k in keys]
            )
    (out / "kvpress.json").write_text(json.dumps(result))


def kvbench_side(out: Path, real: bool) -> None:
    """KVBench's presets on the same weights and prompts; prints the agreement per case."""
    from methods import SnapKV, ThinK
    from methods.think import KeptChannels
    from runners.setup.budget import resolve_budget

    model, _, prompts, theirs = driver.kvbench_inputs(out, real)
    snap = SnapKV(window_size=64, kernel_size=5, pooling="avg", decode_budget=False)  # kvpress's SnapKV
    ours = {"think": (ThinK(), None), "think_snapkv": (ThinK(press=snap), 0.5)}
    for name, (method, share) in ours.items():
        jaccard = []
        for p, ids in enumerate(prompts):
            budget = None if share is None else resolve_budget(share, ids.shape[1])
            for i, layer in enumerate(driver.prefill(model, ids, method, budget).layers):
                codec = layer.store.codec
                assert isinstance(codec, KeptChannels)
                for h, channels in enumerate(codec.channels[0].tolist()):
                    jaccard.append(driver.jaccard_index(set(channels), set(theirs[name][p][i][h])))
        print(driver.agreement(name, jaccard, 14, sets="channel sets ", digits=4))


if __name__ == "__main__":
    driver.main(__doc__, __file__, kvpress_side, kvbench_side)
