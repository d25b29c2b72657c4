"""Decode-step time with and without the Triton decode kernel (CUDA), recorded, not asserted.

1. The decode-attention op alone: ``kernels.decode_attention_torch`` vs the Triton kernel on one
   layer's cache ``[batch, kv_heads, slots, head_dim]`` (median of CUDA-event timed calls).
2. Whole decode steps of a randomly initialised model (weights do not change the cost) with the
   ``torch`` and ``triton`` backends, their steps alternating on two caches of the same prompt.

    python scripts/bench_kernels.py --device cuda --shape smollm2 --context 8192
    python scripts/bench_kernels.py --device cuda --shape 7b --layers 8 --context 8192
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels import decode_attention_torch, set_backend
from methods import METHOD_REGISTRY
from runners.measure.timing import Decoder, call_ms, synthetic_prompts
from runners.output.environment import device_info
from runners.setup.budget import resolve_budget

SHAPES = {  # Llama-architecture shapes: hidden, heads, kv heads, intermediate, layers, vocab
    "smollm2": dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                    num_hidden_layers=30, vocab_size=49152),
    "7b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008,
               num_hidden_layers=32, vocab_size=32000),
}  # fmt: skip


def random_llama(shape: str, layers: int | None, context: int, dtype: torch.dtype, device: str):
    """A randomly initialised Llama of ``shape`` ("kvbench" attention), ``layers`` deep if given."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(SHAPES[shape], max_position_embeddings=context + 64)
    if layers:
        kwargs["num_hidden_layers"] = layers
    config = LlamaConfig(**kwargs)
    config._attn_implementation = "kvbench"
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def time_op(fn, repeats: int) -> float:
    """Median milliseconds of ``fn()`` (CUDA events, or wall time on CPU)."""
    for _ in range(3):
        fn()
    return statistics.median(call_ms(fn, torch.cuda.is_available()) for _ in range(repeats))


def op_table(model, slots_list: list[int], batch: int, device: str, repeats: int) -> list[dict]:
    """Part 1: the attention op on one layer's cache at each slot count."""
    from kernels.triton_decode import triton_decode_attention

    cfg = model.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // hq
    rows = []
    for n in slots_list:
        q = torch.randn(batch, hq, 1, d, device=device, dtype=model.dtype)
        k, v = (torch.randn(batch, hkv, n, d, device=device, dtype=model.dtype) for _ in range(2))
        lw = torch.zeros(batch, hkv, n, device=device)
        torch_ms = time_op(lambda: decode_attention_torch(q, k, v, lw, d**-0.5), repeats)  # noqa: B023
        triton_ms = time_op(lambda: triton_decode_attention(q, k, v, lw, d**-0.5), repeats)  # noqa: B023
        rows.append(
            {"slots": n, "torch_ms": torch_ms, "triton_ms": triton_ms, "speedup": torch_ms / triton_ms}
        )
    return rows


def step_table(model, methods: list[str], budgets: list[float], args) -> list[dict]:
    """Part 2: median decode-step time with each backend, steps alternating."""
    rows = []
    prompt = synthetic_prompts(model.config.vocab_size, args.batch, args.context, 0).to(args.device)
    for name in methods:
        for fraction in budgets:
            method = METHOD_REGISTRY[name]()
            budget = resolve_budget(fraction, args.context, model.config.max_position_embeddings, "prompt")
            decoders = {b: Decoder(model, prompt, method, budget) for b in ("torch", "triton")}
            times: dict[str, list[float]] = {b: [] for b in decoders}
            for i in range(args.warmup + args.steps):
                for backend, decoder in decoders.items():
                    set_backend(backend)
                    seconds = decoder.step()
                    if i >= args.warmup:
                        times[backend].append(1000 * seconds)
            t, k = statistics.median(times["torch"]), statistics.median(times["triton"])
            same = all(
                torch.equal(a, b)
                for a, b in zip(decoders["torch"].tokens, decoders["triton"].tokens, strict=True)
            )
            rows.append({"method": name, "budget": fraction, "slots": budget, "torch_ms": t, "triton_ms": k,
                         "speedup": t / k, "same_tokens": same})  # fmt: skip
            del decoders
    set_backend("auto")
    return rows


def main() -> None:
    """Run both parts and print (and optionally save) the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="layer stack depth (default: the model's)")
    parser.add_argument("--context", type=int, default=8192, help="prompt tokens (slots at budget 1.0)")
    parser.add_argument("--methods", default="zsmerge,h2o,keepkv")
    parser.add_argument("--budgets", default="1.0,0.05", help="fractions of the prompt")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=50, help="op timings per point")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = random_llama(args.shape, args.layers, args.context, getattr(torch, args.dtype), args.device)
    print(f"device: {device_info(torch.device(args.device))}; shape {args.shape}, "
          f"{model.config.num_hidden_layers} layers, {args.dtype}, batch {args.batch}")  # fmt: skip
    ops = op_table(model, [512, 2048, args.context], args.batch, args.device, args.repeats)
    print("\n1. decode attention op (one layer), ms")
    for r in ops:
        print(f"   slots {r['slots']:>6}  torch {r['torch_ms']:8.4f}  triton {r['triton_ms']:8.4f}  "
              f"speedup {r['speedup']:.2f}x")  # fmt: skip
    steps = step_table(model, args.methods.split(","), [float(b) for b in args.budgets.split(",")], args)
    print(f"\n2. decode step at context {args.context}, ms/step (median of {args.steps})")
    for r in steps:
        head = f"   {r['method']:<8} budget {r['budget']:<5} slots {r['slots']:>5}"
        print(f"{head}  torch {r['torch_ms']:8.3f}  triton {r['triton_ms']:8.3f}  "
              f"speedup {r['speedup']:.2f}x  same tokens {r['same_tokens']}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "ops": ops, "steps": steps}, indent=2))


if __name__ == "__main__":
    main()
