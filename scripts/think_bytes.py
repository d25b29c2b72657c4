"""KV bytes ThinK holds against FullKV and SnapKV on one real XSum prompt of the embedded model
(SmolLM2-135M-Instruct, ``configs/model/smollm2-135m.yaml``), budget 0.5 of the prompt, 64 greedy tokens:
the presets ``fullkv``, ``snapkv_avg`` (kvpress's SnapKV), ``think`` and ``think_snapkv``; bytes held at
the end of decoding (``GenerationResult.kv_bytes``) and the uncompressed cache's.

Usage::

    KVBENCH_DATA_DIR=/path/to/data python scripts/think_bytes.py [--sample 0]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=0, help="XSum test row")
    args = parser.parse_args()
    from omegaconf import OmegaConf

    import methods  # noqa: F401  (registers the "kvbench" attention implementation)
    from methods import FullKV, SnapKV, ThinK
    from runners.generation.greedy import greedy_generate
    from runners.models.loading import load_model, load_tokenizer
    from runners.setup.budget import resolve_budget
    from tasks.xsum import XSum

    cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "model" / "smollm2-135m.yaml")
    model, tokenizer = load_model(cfg), load_tokenizer(cfg)
    task = XSum(data_dir=os.environ.get("KVBENCH_DATA_DIR"), limit=args.sample + 1)
    sample = task.load(tokenizer)[args.sample]
    ids = task.encode(tokenizer, sample)
    budget = resolve_budget(0.5, ids.shape[1])
    snap = SnapKV(window_size=64, kernel_size=5, pooling="avg", decode_budget=False)
    rows = {}
    for name, method, b in (
        ("fullkv", FullKV(), None),
        ("snapkv_avg", snap, budget),
        ("think", ThinK(), None),
        ("think_snapkv", ThinK(press=snap), budget),
    ):
        res = greedy_generate(model, ids, method, b, 64, set())
        rows[name] = (res.kv_bytes, res.fullkv_bytes, len(res.tokens))
    full = rows["fullkv"][0]
    print(f"XSum test row {args.sample}: {ids.shape[1]} prompt tokens, budget {budget} (0.5)")
    for name, (held, uncompressed, new) in rows.items():
        print(
            f"{name:14s} kv_bytes {held:>11,d}  {held / full:.3f} of FullKV's  ({new} tokens, "
            f"uncompressed {uncompressed:,d})"
        )


if __name__ == "__main__":
    main()
