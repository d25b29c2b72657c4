"""Decode attention over ragged heads vs uniform heads at equal total slots, one layer per call.

Uniform: every KV head holds ``--slots`` slots (``kernels.decode_attention``, ``[batch, kv_heads,
slots, head_dim]``). Ragged: the same total, spread over the heads of each batch row in proportion
to 1, 2, ..., kv_heads (SmolLM2's 3 heads at 512 hold 256, 512 and 768), packed in one buffer
(``kernels.ragged_decode``). Both return the group-mean probabilities (what H2O-like methods
score with), without a log-weight bias. Rows: the PyTorch paths (the ragged specification, and on the
CPU the per-segment products its dispatch runs, ``kernels.ragged_decode.per_segment_attention``), and on
CUDA the Triton kernels (``kernels.triton_decode`` vs ``kernels.triton_ragged``). Each figure is the
median of ``--repeats`` calls, the uniform and ragged calls alternating (a shared machine's drift hits
both alike).

    python scripts/bench_ragged.py                                 # CPU, SmolLM2 shape, 512 and 2048
    python scripts/bench_ragged.py --device cuda --shape llama3-8b --slots 4096 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.decode_attention import decode_attention_torch
from kernels.ragged_decode import per_segment_attention, ragged_decode_attention_torch
from runners.measure.timing import call_ms
from runners.output.environment import device_info

SHAPES = {  # KV heads, query heads per KV head, head_dim
    "smollm2": (3, 3, 64),
    "llama3-8b": (8, 4, 128),
}


def ragged_lengths(kv_heads: int, slots: int) -> list[int]:
    """Per-head slot counts in proportion to 1..kv_heads, summing to ``kv_heads * slots``."""
    total, weight = kv_heads * slots, kv_heads * (kv_heads + 1) // 2
    lengths = [total * (h + 1) // weight for h in range(kv_heads)]
    lengths[-1] += total - sum(lengths)
    return lengths


def inputs(shape: str, slots: int, batch: int, dtype: torch.dtype, device: str) -> tuple[tuple, tuple]:
    """The uniform call's arguments and the ragged call's (same queries, same total slots)."""
    kv_heads, group, d = SHAPES[shape]
    query = torch.randn(batch, kv_heads * group, 1, d, device=device, dtype=dtype)
    keys, values = (torch.randn(batch, kv_heads, slots, d, device=device, dtype=dtype) for _ in range(2))
    lengths = torch.tensor(ragged_lengths(kv_heads, slots) * batch, device=device)
    offsets = torch.cumsum(lengths, 0) - lengths
    n = batch * kv_heads * slots
    segment = torch.repeat_interleave(torch.arange(batch * kv_heads, device=device), lengths)
    valid = torch.ones(n, dtype=torch.bool, device=device)
    packed = (torch.randn(n, d, device=device, dtype=dtype) for _ in range(2))
    ragged = (query.view(batch * kv_heads, group, d), *packed, offsets, lengths, segment, valid)
    return (query, keys, values, None), ragged


def time_pair(first, second, repeats: int, cuda: bool) -> tuple[float, float]:
    """Median milliseconds of ``first()`` and ``second()``, calls alternating."""
    for _ in range(3):
        first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, times[0]), (second, times[1])):
            out.append(call_ms(fn, cuda))
    return statistics.median(times[0]), statistics.median(times[1])


def measure(args: argparse.Namespace, slots: int) -> dict:
    """One row: PyTorch (and on CUDA Triton) uniform vs ragged at ``slots`` per head."""
    kv_heads, _, d = SHAPES[args.shape]
    uniform, ragged = inputs(args.shape, slots, args.batch, getattr(torch, args.dtype), args.device)
    scale = d**-0.5
    row = {"slots_per_head": slots, "ragged_lengths": ragged_lengths(kv_heads, slots)}
    row["torch_uniform_ms"], row["torch_ragged_ms"] = time_pair(
        lambda: decode_attention_torch(*uniform, scale),
        lambda: ragged_decode_attention_torch(*ragged, None, scale),
        args.repeats,
        args.device == "cuda",
    )
    row["torch_ratio"] = row["torch_ragged_ms"] / row["torch_uniform_ms"]
    if args.device == "cpu":
        row["torch_uniform_ms_2"], row["cpu_ragged_ms"] = time_pair(
            lambda: decode_attention_torch(*uniform, scale),
            lambda: per_segment_attention(*ragged[:5], None, scale, None, True),
            args.repeats,
            False,
        )
        row["cpu_ratio"] = row["cpu_ragged_ms"] / row["torch_uniform_ms_2"]
    if args.device == "cuda":
        from kernels.triton_decode import triton_decode_attention
        from kernels.triton_ragged import triton_ragged_decode_attention

        row["triton_uniform_ms"], row["triton_ragged_ms"] = time_pair(
            lambda: triton_decode_attention(*uniform, scale),
            lambda: triton_ragged_decode_attention(*ragged[:5], None, scale, True),
            args.repeats,
            True,
        )
        row["triton_ratio"] = row["triton_ragged_ms"] / row["triton_uniform_ms"]
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--slots", default="512,2048", help="slots per head, comma-separated")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per figure")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    try:
        args.slot_counts = [int(s) for s in args.slots.split(",")]
    except ValueError:
        parser.error(f"--slots takes comma-separated integers, got {args.slots!r}")
    if min(args.slot_counts) < SHAPES[args.shape][0] or args.batch < 1 or args.repeats < 1:
        parser.error("--slots must be at least the number of KV heads; --batch and --repeats at least 1")
    return args


def main() -> int:
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    kv_heads, group, d = SHAPES[args.shape]
    info = device_info(torch.device(args.device))
    print(f"{info['name']}, {args.shape}: {kv_heads} KV heads, group {group}, head_dim {d}, batch "
          f"{args.batch}, {args.dtype}; ms per layer (one call), median of {args.repeats}")  # fmt: skip
    rows = []
    for slots in args.slot_counts:
        rows.append(row := measure(args, slots))
        line = (f"slots/head {slots:>5} (ragged {row['ragged_lengths']}): torch uniform "
                f"{row['torch_uniform_ms']:.4f}  ragged {row['torch_ragged_ms']:.4f}  "
                f"({row['torch_ratio']:.2f}x)")  # fmt: skip
        if "cpu_ratio" in row:
            line += f"; per-segment (the CPU's path) {row['cpu_ragged_ms']:.4f} ({row['cpu_ratio']:.2f}x)"
        if "triton_ratio" in row:
            line += (f"; triton uniform {row['triton_uniform_ms']:.4f}  ragged "
                     f"{row['triton_ragged_ms']:.4f}  ({row['triton_ratio']:.2f}x)")  # fmt: skip
        print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
