"""Our FullKV decode step against transformers' own caches, in one process: the same model, batch,
prompt and dtype, each step a forward of one token per row plus its greedy argmax.

- ``ours``: FullKV through the seam (``runners.measure.timing.Decoder``), eager, or ``--backend
  compiled``, or both (``--backend eager,compiled``: ``ours`` and ``ours compiled``, whose ratio says
  whether compiling pays); ``--methods zsmerge,h2o --budget 0.05``: compressed methods beside it, the
  same steps interleaved, so a shared machine's drift cancels in their speed-ups (``--shared-prefill``:
  one prefill forward feeds every cache, ``runners.measure.timing.Decoder.shared``);
- ``dynamic``: transformers' ``DynamicCache``, eager, ``attn_implementation="sdpa"``;
- ``static``: transformers' ``StaticCache``, eager (and, on CUDA, ``static+compile``: the forward
  compiled with ``mode="reduce-overhead"``, transformers' own generate setting).

Every speed ratio KVBench prints divides by our FullKV step, so it must be no slower than
transformers' step (target: <= 1.10x the faster eager one). The steps of the caches are interleaved
(one of each in turn), so that drift of the machine hits all alike; each figure is the median.

    python scripts/bench_baseline.py                              # the embedded 135M shape, batch 1
    python scripts/bench_baseline.py --shape llama2-7b --layers 2 --batch 8 --prompt 1024,2048
    python scripts/bench_baseline.py --shape smollm2-135m --prompt 512,4096 --json out.json

Random weights (timings do not depend on weight values): ``--shape`` is a named configuration of
``runners.models.shapes``; ``--layers`` keeps its first N decoder layers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_cuda import build_model

from methods import METHOD_REGISTRY
from runners.generation.model_run import set_decode_backend
from runners.measure.timing import Decoder, synthetic_prompts
from runners.output.environment import device_info


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class HFDecoder:
    """Greedy decode steps of ``model`` with one of transformers' caches (``kind``: dynamic, static,
    static+compile), after a prefill of ``ids`` ``[batch, prompt]``."""

    def __init__(self, model, ids: torch.Tensor, kind: str, steps: int) -> None:
        from transformers import DynamicCache, StaticCache

        self.model, self.device = model, str(ids.device)
        length = ids.shape[1]
        if kind == "dynamic":
            self.cache = DynamicCache(config=model.config)
        else:
            self.cache = StaticCache(config=model.config, max_cache_len=length + steps + 1)
        self.forward = model.forward
        if kind == "static+compile":
            self.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        self.position = length
        with torch.inference_mode():
            out = model(ids, cache=self.cache, use_cache=True, cache_position=torch.arange(length))
        self.token = out.logits[:, -1].argmax(-1)

    @torch.inference_mode()
    def step(self) -> float:
        """One decode step for every row; its wall time (seconds; CUDA synchronised)."""
        _sync(self.device)
        start = time.perf_counter()
        position = torch.tensor([self.position], device=self.token.device)
        out = self.forward(self.token[:, None], cache=self.cache, use_cache=True, cache_position=position)
        self.token = out.logits[:, -1].argmax(-1)
        _sync(self.device)
        self.position += 1
        return time.perf_counter() - start


def measure(model, args, prompt: int) -> dict[str, float]:
    """Median milliseconds per decode step of each decoder at ``prompt`` tokens."""
    ids = synthetic_prompts(model.config.vocab_size, args.batch, prompt, 0).to(args.device)
    total = args.steps + args.warmup
    decoders: dict[str, object] = {}
    model.set_attn_implementation("kvbench")
    slots = max(2, int(args.budget * prompt))
    if args.shared_prefill:  # one prefill forward for our (eager) FullKV and the methods
        settings = [(METHOD_REGISTRY["fullkv"](), None)]
        settings += [(METHOD_REGISTRY[m](), slots) for m in args.methods]
        shared = Decoder.shared(model, ids, settings, prompt + total)
        decoders = dict(zip(["ours", *args.methods], shared, strict=True))
    else:
        for backend in args.backends:  # each run keeps the backend it was built with
            set_decode_backend(backend)
            name = "ours" if backend == args.backends[0] else f"ours {backend}"
            decoders[name] = Decoder(model, ids, METHOD_REGISTRY["fullkv"](), None, prompt + total)
        set_decode_backend(args.backends[0])
        for name in args.methods:  # compressed methods beside FullKV, the same steps interleaved
            decoders[name] = Decoder(model, ids, METHOD_REGISTRY[name](), slots, prompt + total)
    model.set_attn_implementation("sdpa")
    kinds = args.caches + (["static+compile"] if args.device.startswith("cuda") and args.caches else [])
    for kind in kinds:
        decoders[kind] = HFDecoder(model, ids, kind, total)
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(total):
        for name, decoder in decoders.items():
            if name.startswith("ours") or name in args.methods:
                model.set_attn_implementation("kvbench")
            times[name].append(decoder.step())
            model.set_attn_implementation("sdpa")
    return {name: 1e3 * statistics.median(t[args.warmup :]) for name, t in times.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    from runners.models.shapes import SHAPES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", default="512,4096", help="comma-separated prompt lengths")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="eager", help="eager, compiled, or eager,compiled")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--methods", default="", help="methods timed beside our FullKV (at --budget)")
    parser.add_argument("--budget", type=float, default=0.05, help="--methods' slots: a share of the prompt")
    parser.add_argument("--caches", default="dynamic,static", help="transformers' caches ('' for none)")
    parser.add_argument(
        "--shared-prefill",
        action="store_true",
        help="one prefill forward for our FullKV and --methods (eager only; a long prompt's minutes once)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    args.prompts = [int(p) for p in args.prompt.split(",")]
    args.backends = args.backend.split(",")
    args.methods = [m for m in args.methods.split(",") if m]
    args.caches = [c for c in args.caches.split(",") if c]
    if not set(args.methods) <= set(METHOD_REGISTRY) - {"fullkv"}:
        parser.error(f"--methods takes registered methods other than fullkv, got {args.methods}")
    if not set(args.caches) <= {"dynamic", "static"}:
        parser.error(f"--caches takes dynamic, static or both, got {args.caches}")
    if not 0 < args.budget <= 1:
        parser.error(f"--budget is a share of the prompt in (0, 1], got {args.budget}")
    if not set(args.backends) <= {"eager", "compiled"} or len(set(args.backends)) != len(args.backends):
        parser.error(f"--backend takes eager, compiled or eager,compiled, got {args.backend!r}")
    if args.shared_prefill and (args.backends != ["eager"] or not args.methods):
        parser.error("--shared-prefill shares our eager FullKV's prefill with --methods: give both")
    if min(args.prompts) < 1 or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("prompt lengths, --batch and --steps must be >= 1, --warmup >= 0")
    return args


def main() -> None:
    args = parse_args()
    model = build_model(args.shape, getattr(torch, args.dtype), args.device, args.layers)
    layers = model.config.num_hidden_layers
    print(f"device: {device_info(torch.device(args.device))}; {args.shape} ({args.dtype}, {layers} layers), "
          f"batch {args.batch}, backend {args.backend}, median of {args.steps} steps")  # fmt: skip
    rows = []
    for prompt in args.prompts:
        ms = measure(model, args, prompt)
        best = min((ms[c] for c in args.caches), default=None)
        rows.append({"prompt": prompt, **ms, "ratio": None if best is None else ms["ours"] / best})
        cells = "  ".join(f"{k} {v:8.2f} ms" for k, v in ms.items())
        notes = [] if best is None else [f"ours / best eager {ms['ours'] / best:.3f}x"]
        if "ours compiled" in ms:
            notes.append(f"compiled / eager {ms['ours compiled'] / ms['ours']:.3f}x")
        notes += [f"FullKV / {m} {ms['ours'] / ms[m]:.3f}x" for m in args.methods]
        print(f"prompt {prompt:>5}: {cells}  {'  '.join(notes)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {**vars(args)}, "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
