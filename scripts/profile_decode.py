"""Where a method's decode step spends its time: one layer's seam work (append, attention, score
update, eviction/merging) on synthetic tensors, timed per phase and profiled per op.

    python scripts/profile_decode.py keepkv            # vs FullKV, SmolLM2 geometry, B = 512
    python scripts/profile_decode.py zsmerge --slots 1024 --device cuda
    python scripts/profile_decode.py keepkv --backend compiled   # the step as one torch.compile graph

With ``--backend compiled`` the layer's whole decode step (append, attention, update,
eviction/merging) is one ``torch.compile(fullgraph=True)`` graph, as in the model's compiled
forward (``backend=compiled``), and only its total is timed (phases do not exist inside a graph).

The model's own work (projections, MLP) is the same for every method and is left out; multiply
the per-layer microseconds by the number of layers for the per-step cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from methods import METHOD_REGISTRY, CompressedLayer, CompressionMethod
from methods.seam.architecture import LayerSpec
from methods.seam.rope import LayerRotary
from methods.seam.step import prefill_step, prepare_step, update


def build(name: str) -> CompressionMethod:
    return METHOD_REGISTRY[name](checkpoint="random") if name == "less" else METHOD_REGISTRY[name]()


def make_layer(method: CompressionMethod, args, budget: int | None, prompt: int) -> CompressedLayer:
    gen = torch.Generator(device=args.device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=args.device)

    config = LlamaConfig(hidden_size=args.q_heads * args.head_dim, num_attention_heads=args.q_heads,
                         num_key_value_heads=args.kv_heads, head_dim=args.head_dim)  # fmt: skip
    spec = LayerSpec(rotary=LayerRotary(LlamaRotaryEmbedding(config).to(args.device)))  # StreamingLLM
    max_tokens = prompt + 2 * args.steps + 16  # buffers sized for the run, as ModelRun does
    layer = CompressedLayer(method.traits.state_fill, budget, spec, max_tokens=max_tokens)
    layer.update(rand(1, args.kv_heads, prompt, args.head_dim), rand(1, args.kv_heads, prompt, args.head_dim))
    prefill_step(method, layer, rand(1, args.q_heads, prompt, args.head_dim), None, None, args.head_dim**-0.5)
    return layer


def phases(method: CompressionMethod, layer: CompressedLayer, args, steps: int) -> dict[str, float]:
    """Mean microseconds per decode step of each phase of the seam."""
    totals = {"append": 0.0, "attention": 0.0, "update + evict/merge": 0.0}
    scale = args.head_dim**-0.5
    for _ in range(steps):
        k = torch.randn(1, args.kv_heads, 1, args.head_dim, device=args.device)
        q = torch.randn(1, args.q_heads, 1, args.head_dim, device=args.device)
        marks = [time.perf_counter()]
        layer.update(k, k)
        sync(args)
        marks.append(time.perf_counter())
        _, probs = method.decode_attention(layer, q, scale)  # the halves of methods.seam.step.decode_step
        sync(args)
        marks.append(time.perf_counter())
        update(method, layer, probs)
        sync(args)
        marks.append(time.perf_counter())
        for name, a, b in zip(totals, marks, marks[1:], strict=False):
            totals[name] += b - a
    return {name: 1e6 * t / steps for name, t in totals.items()}


def compiled_total(method: CompressionMethod, layer: CompressedLayer, args, steps: int) -> dict[str, float]:
    """Mean microseconds of one compiled decode step (append + attention + update) of ``layer``,
    prepared eagerly first as the model's compiled step is (``methods.seam.step.prepare_step``: a
    growing layer then attends over its static capacity, and the step compiles once); the compiled
    function is warmed up (and compiled) first."""
    scale = args.head_dim**-0.5

    def step(k: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        layer.update(k, k)
        out, probs = method.decode_attention(layer, q, scale)
        update(method, layer, probs)
        return out

    torch._dynamo.reset()
    fn = torch.compile(step, fullgraph=True)
    k = torch.randn(1, args.kv_heads, 1, args.head_dim, device=args.device)
    q = torch.randn(1, args.q_heads, 1, args.head_dim, device=args.device)
    for _ in range(8):  # compiles (a bounded layer again once full)
        prepare_step(method, layer)
        fn(k, q)
    sync(args)
    start = time.perf_counter()
    for _ in range(steps):
        prepare_step(method, layer)
        fn(k, q)
    sync(args)
    return {"step (compiled)": 1e6 * (time.perf_counter() - start) / steps}


def sync(args) -> None:
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("method")
    parser.add_argument("--slots", type=int, default=512)
    parser.add_argument("--prompt-factor", type=int, default=4)
    parser.add_argument("--q-heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ops", type=int, default=15, help="rows of the per-op profile")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", choices=("eager", "compiled"), default="eager")
    args = parser.parse_args()
    time_steps = phases if args.backend == "eager" else compiled_total
    with torch.inference_mode():
        full = METHOD_REGISTRY["fullkv"]()
        base = time_steps(full, make_layer(full, args, None, args.slots), args, args.steps)
        method = build(args.method)
        layer = make_layer(method, args, args.slots, args.prompt_factor * args.slots)
        ours = time_steps(method, layer, args, args.steps)
        print(f"per layer and decode step (us), {args.slots} slots, device {args.device}")
        print(f"{'phase':<24}{'fullkv':>10}{args.method:>14}{'extra':>10}")
        for name in base:
            print(f"{name:<24}{base[name]:>10.1f}{ours[name]:>14.1f}{ours[name] - base[name]:>10.1f}")
        print(f"{'total':<24}{sum(base.values()):>10.1f}{sum(ours.values()):>14.1f}"
              f"{sum(ours.values()) - sum(base.values()):>10.1f}")  # fmt: skip
        if args.backend == "compiled" or args.ops == 0:
            return
        with profile() as prof:
            phases(method, layer, args, 50)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.ops))


if __name__ == "__main__":
    main()
