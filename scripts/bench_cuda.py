"""GPU targets of the compiled decode step, on a model of any shape with random weights
(timings do not depend on weight values), printed and optionally saved as JSON.

(a) Our FullKV decode step (``backend=compiled``) vs transformers' own ``generate`` with a static
    cache and ``torch.compile`` (``mode="reduce-overhead"``, the strongest plain baseline), same
    model, batch and context: target <= 1.2x its per-step time.
(b) Every method's decode step at B slots vs our FullKV at context B (``scripts/bench_overhead.py``
    with ``--backend compiled --device cuda`` prints this one).
(c) Tokens/s of ZSMerge at ``--budget`` over ``--prompt`` + ``--new`` tokens vs FullKV, batch
    ``--batch`` (ZSMerge Table 1: 1.47x at 2048 + 2048, batch 8, Llama-2-7B, 5%).
(d) Achieved memory bandwidth of a step: (weight bytes + KV bytes) / step time, against
    ``--bandwidth`` (the device's peak, GB/s).

    python scripts/bench_cuda.py --shape llama2-7b --json results/bench/cuda.json        # on a GPU
    python scripts/bench_cuda.py --shape llama2-7b --layers 8   # a quarter of the depth, same ratios
    python scripts/bench_cuda.py --shape tiny --device cpu --prompt 64 --new 16 --batch 2 # a dry run

Each figure is the median decode step over the steps after ``--warmup``; CUDA is synchronised
around every timed step. ``--layers`` keeps the first N decoder layers of the shape: every layer
holds the same weights and KV share, so (a), (c) and (d) change only by the embedding and LM head's
share, and compilation takes N/32 of the time. The JSON file is rewritten after each figure, so an
interrupted run keeps the figures it finished.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from methods import METHOD_REGISTRY
from runners.generation.model_run import set_decode_backend
from runners.measure.timing import Decoder, save_figures, synthetic_prompts
from runners.models.random_weights import build_random
from runners.models.shapes import SHAPES
from runners.output.environment import device_info
from runners.setup.budget import resolve_budget


def build_model(shape: str, dtype: torch.dtype, device: str, layers: int | None = None) -> torch.nn.Module:
    """A randomly initialised Llama of ``shape`` (``runners.models.shapes.SHAPES``; ``layers``
    decoder layers if given) with the ``kvbench`` attention, made on ``device`` in ``dtype`` (the
    ``random`` model source's build, ``runners.models.random_weights.build_random``)."""
    node = OmegaConf.create({"shape": shape, "num_layers": layers, "seed": 0})
    kwargs = {"dtype": dtype, "attn_implementation": "kvbench"}
    return build_random(node, kwargs, torch.device(device)).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def ours(model, ids: torch.Tensor, name: str, budget: int | None, steps: int, warmup: int) -> list[float]:
    """Per-step seconds of our loop with compiled decode steps."""
    method = METHOD_REGISTRY[name]()
    decoder = Decoder(model, ids, method, budget, ids.shape[1] + steps + warmup)
    times = [decoder.step() for _ in range(steps + warmup)]
    return times[warmup:]


@torch.inference_mode()
def transformers_static(model, ids: torch.Tensor, steps: int, warmup: int, device: str) -> list[float]:
    """Per-step seconds of ``model.generate`` with a static cache, which transformers compiles itself
    (``CompileConfig``: ``mode="reduce-overhead"``, full graph): a logits processor stamps the wall
    clock at every step (CUDA synchronised), and a step is the time between two stamps, after
    ``warmup`` steps. (The difference of two ``generate`` lengths divided by the extra steps is not
    used: each call's prefill varies by more than a step at long prompts, so it misestimated the
    step by up to 2-3x on a CPU.)"""
    from transformers import CompileConfig, LogitsProcessor, LogitsProcessorList

    torch._dynamo.reset()  # its graphs must not count towards ours (same forward code object)
    torch._dynamo.config.fail_on_recompile_limit_hit = False
    model.set_attn_implementation("sdpa")
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            sync(device)
            stamps.append(time.perf_counter())
            return scores

    def run(new: int) -> None:
        stamps.clear()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                       logits_processor=LogitsProcessorList([Stamp()]))  # fmt: skip

    run(warmup + 2)  # compile
    run(warmup + steps + 1)
    model.set_attn_implementation("kvbench")
    model.__dict__.pop("_kvbench_compiled", None)  # ours recompiles from a clean slate
    return [b - a for a, b in itertools.pairwise(stamps)][warmup:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="llama2-7b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=2048, help="decode steps of (c)")
    parser.add_argument("--steps", type=int, default=64, help="timed steps of (a)")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--budget", type=float, default=0.05, help="ZSMerge budget of (c)")
    parser.add_argument("--bandwidth", type=float, default=3350.0, help="device peak GB/s (H100 SXM: 3350)")
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    set_decode_backend("compiled")
    model = build_model(args.shape, getattr(torch, args.dtype), args.device, args.layers)
    ids = synthetic_prompts(model.config.vocab_size, args.batch, args.prompt, 0).to(args.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out: dict = {"device": device_info(torch.device(args.device)), "args": vars(args)}
    layers = model.config.num_hidden_layers
    print(
        f"device: {out['device']}; {args.shape} ({args.dtype}, {layers} layers), batch {args.batch}, "
        f"prompt {args.prompt}"
    )

    full = statistics.median(ours(model, ids, "fullkv", None, args.steps, args.warmup))
    base = statistics.median(transformers_static(model, ids, args.steps, args.warmup, args.device))
    out["a"] = {"ours_fullkv_ms": 1000 * full, "transformers_static_compiled_ms": 1000 * base,
                "ratio": full / base, "target": 1.2}  # fmt: skip
    print(f"(a) FullKV step {1000 * full:.2f} ms vs transformers static+compile {1000 * base:.2f} ms: "
          f"{full / base:.3f}x (target <= 1.2)")  # fmt: skip
    save_figures(out, args.json)

    rates = {}
    for name in ("fullkv", "zsmerge"):
        budget = None if name == "fullkv" else resolve_budget(args.budget, args.prompt)
        method = METHOD_REGISTRY[name]()
        decoder = Decoder(model, ids, method, budget, args.prompt + args.new)
        for _ in range(args.warmup):  # compilation happens here
            decoder.step()
        timed = args.new - 1 - args.warmup
        sync(args.device)
        start = time.perf_counter()
        for _ in range(timed):
            decoder.step()
        seconds = time.perf_counter() - start
        rates[name] = args.batch * timed / seconds
        if name == "fullkv":
            kv_bytes, step_s = decoder.cache.kv_bytes(), seconds / timed
    out["c"] = {"tokens_per_s": rates, "speedup": rates["zsmerge"] / rates["fullkv"], "paper": 1.47}
    speedup = rates["zsmerge"] / rates["fullkv"]
    print(f"(c) tokens/s over {args.prompt}+{args.new}: FullKV {rates['fullkv']:.1f}, ZSMerge@{args.budget} "
          f"{rates['zsmerge']:.1f}: {speedup:.2f}x (ZSMerge Table 1: 1.47x)")  # fmt: skip
    save_figures(out, args.json)

    achieved = (weight_bytes + kv_bytes / 2) / step_s / 1e9  # mean KV over the run: half the final
    out["d"] = {"weight_bytes": weight_bytes, "final_kv_bytes": kv_bytes,
                "step_ms": 1000 * step_s, "achieved_gb_s": achieved,
                "peak_gb_s": args.bandwidth}  # fmt: skip
    moved, share = (weight_bytes + kv_bytes / 2) / 1e9, 100 * achieved / args.bandwidth
    print(f"(d) FullKV step moves {moved:.2f} GB in {1000 * step_s:.2f} ms: "
          f"{achieved:.0f} GB/s of {args.bandwidth:.0f} ({share:.0f}%)")  # fmt: skip
    save_figures(out, args.json)
    print("(b) run: python scripts/bench_overhead.py --device cuda --backend compiled")


if __name__ == "__main__":
    main()
