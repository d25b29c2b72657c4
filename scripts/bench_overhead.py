"""Decode-path benchmark of every method against FullKV (overhead and throughput targets), side by side.

1. Overhead ratio: the median decode-step time of a method holding ``--slots`` B slots (a prompt of
   ``--prompt-factor`` x B tokens compressed to B), divided by FullKV's decode-step time at a context
   of B tokens. Targets: <= 1.10 for eviction methods, <= 1.25 for merging methods, <= 1.5 for LESS.
2. Throughput at a ``--budget`` fraction (5%): decode tokens/s of each method at contexts
   ``--contexts`` (1K ... 8K, the embedded model's longest), divided by FullKV's at the longest
   context. Target: >= 2x, and flat (within 10%) from the shortest to the longest context.

Method and FullKV decode steps alternate (two caches, one model, ``runners.measure.timing.Decoder``), so
that drifts of a shared machine hit both alike; each figure is the median over ``--repeats`` fresh
prefills x ``--steps`` timed steps, after ``--warmup`` untimed steps. Prompts are random token ids.
LESS runs with untrained random kernels (its cost does not depend on their values) and KVMerger with
``exact_budget=true`` so that it holds the budget.

    python scripts/bench_overhead.py                      # all methods, embedded model, CPU
    python scripts/bench_overhead.py --backend compiled   # the same with compiled decode steps
    python scripts/bench_overhead.py --device cuda --json results/bench/overhead.json
    python scripts/bench_overhead.py --device cuda --random-weights path/to/config.json   # no weights

The JSON file (``--json``) is rewritten after each method, so an interrupted run keeps the rows it
finished.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from methods import METHOD_REGISTRY, CompressionMethod
from runners.generation.model_run import BACKENDS, set_decode_backend
from runners.measure.timing import Decoder, save_figures, synthetic_prompts
from runners.output.environment import device_info
from runners.setup.budget import resolve_budget

FAMILY = {
    "h2o": "eviction",
    "snapkv": "eviction",
    "streamingllm": "eviction",
    "zsmerge": "merging",
    "kvmerger": "merging",
    "keepkv": "merging",
    "less": "learned state",
}
#: Families of methods measured on request (``--methods``), not by default.
FAMILY_EXTRA = {"adakv_snapkv": "eviction", "pyramidkv": "eviction", "tova": "eviction", "knorm": "eviction"}
TARGET = {"eviction": 1.10, "merging": 1.25, "learned state": 1.5}  # max method / FullKV step time


def build(name: str) -> CompressionMethod:
    """The method with its defaults (LESS: random kernels; KVMerger: exact budget), or a preset of
    configs/method (``adakv_snapkv``: an allocator over its scorer)."""
    if name == "kvmerger":
        return METHOD_REGISTRY[name](exact_budget=True)
    if name == "less":
        return METHOD_REGISTRY[name](checkpoint="random")
    preset = Path(__file__).resolve().parents[1] / "configs" / "method" / f"{name}.yaml"
    if name not in METHOD_REGISTRY and preset.is_file():
        from hydra.utils import instantiate
        from omegaconf import OmegaConf

        return instantiate(OmegaConf.load(preset))
    return METHOD_REGISTRY[name]()


def random_model(config_json: str, dtype: str, device: str) -> torch.nn.Module:
    """A randomly initialised causal LM of a transformers ``config.json``, "kvbench" attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_json)
    config._attn_implementation = "kvbench"
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.to(device).eval()


def interleaved(model, runs: list[tuple[CompressionMethod, int, int | None]], args) -> list[float]:
    """Median decode-step time (ms) of each ``(method, prompt tokens, budget)``, their steps
    alternating, over ``args.repeats`` fresh prefills."""
    times: list[list[float]] = [[] for _ in runs]
    model.__dict__.pop("_kvbench_compiled", None)  # compiled steps: a clean slate per comparison
    for _ in range(args.repeats):
        decoders = [
            Decoder(
                model, synthetic_prompts(model.config.vocab_size, args.batch, p, 0).to(model.device), m, b
            )
            for m, p, b in runs
        ]
        for i in range(args.warmup + args.steps):
            for t, decoder in zip(times, decoders, strict=True):
                seconds = decoder.step()
                if i >= args.warmup:
                    t.append(1000 * seconds)
    return [statistics.median(t) for t in times]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help="configs/model/<name>.yaml")
    parser.add_argument("--methods", default=",".join(FAMILY), help="comma-separated registry names")
    parser.add_argument("--slots", type=int, default=512, help="B of the overhead ratio (tokens)")
    parser.add_argument("--prompt-factor", type=int, default=4, help="prompt = factor x B for the methods")
    parser.add_argument("--budget", type=float, default=0.05, help="fraction of the prompt for part 2")
    parser.add_argument("--contexts", default="1024,2048,4096,8192", help="part 2 contexts (tokens)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="eager", choices=BACKENDS, help="decode steps eager or compiled")
    parser.add_argument("--dtype", default=None, help="override the model config's dtype")
    parser.add_argument("--skip", default="", help="'overhead' or 'throughput' to run one part only")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument(
        "--random-weights",
        default=None,
        metavar="CONFIG_JSON",
        help="a randomly initialised model of this transformers config.json instead of the model's weights "
        "(timings do not depend on weight values; for machines without the weights)",
    )
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    root = Path(__file__).resolve().parent.parent
    model_cfg = OmegaConf.load(root / "configs" / "model" / f"{args.model}.yaml")
    if args.dtype:
        model_cfg.dtype = args.dtype
    model = random_model(args.random_weights, model_cfg.dtype, args.device) if args.random_weights else None
    if model is None:
        from runners.models.loading import load_model

        model = load_model(model_cfg, args.device)
    set_decode_backend(args.backend)
    names = args.methods.split(",")
    contexts = [int(c) for c in args.contexts.split(",")]
    # every prompt leaves room for the decode steps within the model's context
    room = model_cfg.max_context - args.warmup - args.steps - 1
    prompts = [min(c, room) for c in contexts]
    full = METHOD_REGISTRY["fullkv"]()
    out = {"device": device_info(model.device), "args": vars(args), "overhead": {}, "throughput": {}}
    print(f"device: {out['device']}; model {args.model} ({model_cfg.dtype}); batch {args.batch}")
    print(f"decode steps: {args.backend}")

    if args.skip != "overhead":
        b, prompt = args.slots, args.prompt_factor * args.slots
        print(
            f"\n1. decode-step overhead: method holding B = {b} slots (prompt {prompt}) "
            f"vs FullKV at context {b}"
        )
        print(f"   {'method':<14}{'family':<15}{'ms/step':>9}{'FullKV':>9}{'ratio':>8}{'target':>8}  ok")
        for name in names:
            family = (FAMILY | FAMILY_EXTRA).get(name, "other")
            try:
                ms, full_ms = interleaved(model, [(build(name), prompt, b), (full, b, None)], args)
            except Exception as exc:  # recorded as such; the next method runs
                print(f"   {name:<14}{family:<15}  error: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                out["overhead"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}", "family": family}
                save_figures(out, args.json)
                continue
            target = TARGET.get(family)
            ratio = ms / full_ms
            ok = "-" if target is None else ("yes" if ratio <= target else "NO")
            cells = f"{ms:>9.2f}{full_ms:>9.2f}{ratio:>8.3f}{target or float('nan'):>8.2f}"
            print(f"   {name:<14}{family:<15}{cells}  {ok}", flush=True)
            out["overhead"][name] = {
                "step_ms": ms, "fullkv_step_ms": full_ms, "ratio": ratio, "target": target, "family": family
            }  # fmt: skip
            save_figures(out, args.json)

    if args.skip != "throughput":
        print(f"\n2. decode tokens/s at budget {args.budget} of the prompt vs FullKV at {prompts[-1]} tokens")
        header = "".join(f"{p:>9}" for p in prompts)
        print(f"   {'method':<14}{header}{'FullKV':>9}  {'speedup':>8}{'flat':>7}  ok")
        for name in names:
            runs = [(build(name), p, resolve_budget(args.budget, p)) for p in prompts]
            ms = interleaved(model, [*runs, (full, prompts[-1], None)], args)
            rates = [args.batch * 1000 / m for m in ms]
            speedup, flat = rates[-2] / rates[-1], rates[-2] / rates[0]
            ok = "yes" if speedup >= 2 and flat >= 0.9 else "NO"
            cells = "".join(f"{r:>9.1f}" for r in rates)
            print(f"   {name:<14}{cells}  {speedup:>7.2f}x{flat:>7.2f}  {ok}", flush=True)
            out["throughput"][name] = {
                "tokens_per_s": dict(zip(prompts, rates[:-1], strict=True)),
                "fullkv_tokens_per_s": rates[-1],
                "speedup": speedup,
                "flat": flat,
            }
            save_figures(out, args.json)
    save_figures(out, args.json)


if __name__ == "__main__":
    main()
