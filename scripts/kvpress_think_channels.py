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

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kvpress_kept_sets as kept_sets  # the models and prompts of the kept-set check


def kvpress_side(out: Path) -> None:
    """kvpress's kept channels under ``out`` (the tiny model's weights and prompts saved there first,
    or the real model and prompts KVBench's side exported)."""
    import kvpress as kp
    from transformers import AutoModelForCausalLM, DynamicCache

    if (out / "model").is_dir():
        model = AutoModelForCausalLM.from_pretrained(out / "model", attn_implementation="sdpa").eval()
        prompts = torch.load(out / "prompts.pt")
    else:
        model = kept_sets.tiny_llama("sdpa")
        torch.save(model.state_dict(), out / "weights.pt")
        seeds = [torch.Generator().manual_seed(s) for s in range(3)]
        prompts = [torch.randperm(kept_sets.VOCAB, generator=g)[: kept_sets.N][None] for g in seeds]
        torch.save(prompts, out / "prompts.pt")
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
    from runners.generation.greedy import greedy_generate
    from runners.setup.budget import resolve_budget

    if real:
        model, _ = kept_sets.real_model()
    else:
        model = kept_sets.tiny_llama("kvbench")
        model.load_state_dict(torch.load(out / "weights.pt"))
    prompts, theirs = torch.load(out / "prompts.pt"), json.loads((out / "kvpress.json").read_text())
    snap = SnapKV(window_size=64, kernel_size=5, pooling="avg", decode_budget=False)  # kvpress's SnapKV
    ours = {"think": (ThinK(), None), "think_snapkv": (ThinK(press=snap), 0.5)}
    for name, (method, share) in ours.items():
        jaccard = []
        for p, ids in enumerate(prompts):
            seen: list = []
            budget = None if share is None else resolve_budget(share, ids.shape[1])
            greedy_generate(model, ids, method, budget, 1, set(), lambda c, seen=seen: seen or seen.append(c))
            for i, layer in enumerate(seen[0].layers):
                codec = layer.store.codec
                assert isinstance(codec, KeptChannels)
                for h, channels in enumerate(codec.channels[0].tolist()):
                    a, b = set(channels), set(theirs[name][p][i][h])
                    jaccard.append(len(a & b) / len(a | b))
        same = sum(j == 1.0 for j in jaccard)
        print(
            f"{name:14s} identical channel sets {same}/{len(jaccard)}  Jaccard mean "
            f"{sum(jaccard) / len(jaccard):.4f} min {min(jaccard):.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvpress-python", help="python of a venv with kvpress installed")
    parser.add_argument("--real", action="store_true", help="the embedded model on real prompts")
    parser.add_argument("--kvpress-side", type=Path, help=argparse.SUPPRESS)  # the re-run under kvpress
    args = parser.parse_args()
    if args.kvpress_side is not None:
        kvpress_side(args.kvpress_side)
        return
    if not args.kvpress_python:
        parser.error("--kvpress-python is required")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            model, tokenizer = kept_sets.real_model()
            model.config.attn_implementation = "sdpa"
            model.save_pretrained(Path(tmp) / "model")
            torch.save(kept_sets.real_prompts(tokenizer), Path(tmp) / "prompts.pt")
            del model
        subprocess.run([args.kvpress_python, __file__, "--kvpress-side", tmp], check=True)
        kvbench_side(Path(tmp), args.real)


if __name__ == "__main__":
    main()
