"""Decode-step time and bytes of quantized storage (``quant=``) against the unquantized cache.

For each method and quant kind: the median decode-step time of the method over quantized storage
divided by the same method's over the uniform full-precision store, their steps alternating (two
caches, one model, ``runners.measure.timing.Decoder``), so that a shared machine's drift hits both alike; and
the KV bytes held at the end over FullKV's. Target (CPU, eager): step ratio <= 1.5.

    python scripts/bench_quant.py --methods fullkv,snapkv,tova --quant int8,int4,kivi2 --prompt 1024
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from methods import METHOD_REGISTRY
from methods.quant import storage_kind
from runners.measure.timing import Decoder, synthetic_prompts

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def decoder(model, prompt: torch.Tensor, name: str, budget: float, quant: str, steps: int) -> Decoder:
    """A prefilled decoder of method ``name`` over ``quant`` storage."""
    params = {k: v for k, v in OmegaConf.load(CONFIGS / "quant" / f"{quant}.yaml").items() if k != "name"}
    method = METHOD_REGISTRY[name]()
    slots = None if not method.traits.budget_applies else max(2, int(budget * prompt.shape[1]))
    return Decoder(model, prompt, method, slots, prompt.shape[1] + steps + 8, storage_kind(quant, params))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="configs/model/<name>.yaml")
    p.add_argument("--methods", default="fullkv,snapkv,tova")
    p.add_argument("--quant", default="int8,int4,kivi2")
    p.add_argument("--budget", type=float, default=0.5, help="fraction of the prompt kept")
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=4)
    args = p.parse_args()
    from runners.models.loading import load_model

    model = load_model(OmegaConf.load(CONFIGS / "model" / f"{args.model}.yaml"))
    prompt = synthetic_prompts(model.config.vocab_size, 1, args.prompt, 0)
    print("| method | quant | step ms | unquantized step ms | **ratio** | KV bytes / FullKV |")
    print("|---|---|---:|---:|---:|---:|")
    for name in args.methods.split(","):
        for quant in args.quant.split(","):
            pair = [decoder(model, prompt, name, args.budget, q, args.steps) for q in (quant, "none")]
            times: list[list[float]] = [[], []]
            for i in range(args.warmup + args.steps):
                for t, d in zip(times, pair, strict=True):
                    seconds = d.step()
                    if i >= args.warmup:
                        t.append(1000 * seconds)
            quantized, plain = (statistics.median(t) for t in times)
            held = pair[0].cache.kv_bytes() / pair[0].cache.fullkv_bytes()
            ratio = quantized / plain
            print(f"| {name} | {quant} | {quantized:.1f} | {plain:.1f} | **{ratio:.2f}** | {held:.3f} |")


if __name__ == "__main__":
    main()
