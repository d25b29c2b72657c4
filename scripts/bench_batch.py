"""Batched quality runs (``runner.batch_size``): samples/s of XSum generation at batch 1, 4 and 8, the
peak memory, and whether every batch size gives batch 1's predictions token for token.

What is timed is what a quality run does per sample (``runners.quality``): the prompt's prefill on
its own cache, its question chunk (none for XSum) and its decode steps, which ``runners.generation.batched``
runs for up to ``batch_size`` samples in one model forward (continuous batching: a finished sample's
place goes to the next prompt at once). One model load serves every (method, batch) cell; the
samples are the task's first ``--limit`` (XSum test, the chat prompt, 64 new tokens at most), with
a budget of ``--budget`` of each prompt. The peak memory is the process's resident set (CPU) or the
device's allocated peak (CUDA) over each cell, the model included.

    python scripts/bench_batch.py                                  # embedded model, CPU, 20 samples
    python scripts/bench_batch.py --device cuda --batches 1,8,16 --json results/bench/batch.json
    python scripts/bench_batch.py --methods all --batches 1,8 --skip-timing   # the identity check only

After the table, the ceilings of the decode part: the model's own one-token forward (transformers'
SDPA attention over a ``DynamicCache``) at the largest batch against batch 1, alternating, median of
20, with 16 tokens cached (the weights' products nearly all of it: what batching gives at most on this
machine) and with the samples' mean prompt length cached (FullKV's attention too: what batching gives
at most when every row attends its whole prompt, whatever the cache does). The whole run's ceiling
follows from the decode ceiling and batch 1's prefill share (a prompt's prefill is one forward of its
own, whatever the batch). Last, per method, one decode step of the first samples' rows together against
the first row's alone: the cache's batching, without the run's batch draining at its end.

Targets: batch 8 >= 2.5x the samples/s of batch 1 on a 2-core CPU, >= 6x
on a GPU. Exit code 1 if any cell's predictions differ from batch 1's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runners.generation.batched import decode_rows  # noqa: E402
from runners.generation.greedy import eos_token_ids  # noqa: E402
from runners.generation.model_run import cache_keyword, forward_rows  # noqa: E402
from runners.models.loading import load_model  # noqa: E402
from runners.output.environment import device_info, peak_device_bytes, peak_rss_bytes, reset_peak_memory  # noqa: E402
from runners.quality import check_budgets, question_starts, sample_rows  # noqa: E402
from runners.setup.build import build_components, load_prompts  # noqa: E402
from runners.setup.settings import RunSettings, read_settings  # noqa: E402

METHODS = ("fullkv", "h2o", "snapkv", "zsmerge", "keepkv")
#: Presets a user must complete (a gate pattern, per-layer ratios) or that need trained kernels.
NOT_RUNNABLE = ("duo_attention", "layer_ratios", "less", "less_random")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS), help="method presets, or 'all'")
    p.add_argument("--batches", default="1,4,8", help="batch sizes; the first must be 1 (the reference)")
    p.add_argument("--budget", type=float, default=0.1, help="fraction of each prompt kept")
    p.add_argument("--limit", type=int, default=20, help="XSum samples")
    p.add_argument("--model", default="smollm2-135m", help="model preset (configs/model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--skip-timing", action="store_true", help="no table of speed (the identity check only)")
    p.add_argument("--json", default=None, help="write the figures here (rewritten after every cell)")
    return p.parse_args()


def presets(names: str) -> list[str]:
    if names != "all":
        return names.split(",")
    found = sorted(p.stem for p in (ROOT / "configs" / "method").glob("*.yaml"))
    variants = ("zsmerge_", "kvmerger_", "keepkv_")  # the same methods with other papers' settings
    return [n for n in found if n not in NOT_RUNNABLE and not n.startswith(variants)]


def cell_rows(model, settings: RunSettings, limit: int | None = None) -> tuple[list, list, list]:
    """The task's samples (the first ``limit``), their prompts, and their rows to decode
    (``runners.quality.sample_rows``: each ``(index, start)``), as a quality run builds them."""
    method, task = build_components(settings)
    tokenizer, samples, prompts = load_prompts(settings.model, task)
    samples, prompts = samples[:limit], prompts[:limit]
    starts = question_starts(tokenizer, task, samples, prompts)
    budgets = check_budgets(settings, method, settings.budget, samples, prompts, task, starts)
    eos = eos_token_ids(model, tokenizer)
    return (
        samples,
        prompts,
        sample_rows(model, tokenizer, task, method, samples, prompts, budgets, starts, eos),
    )


def run_cell(
    model, settings: RunSettings, batch: int
) -> tuple[list[list[int]], float, int | None, float, float, float]:
    """Generate every sample at ``batch``: (tokens per sample, samples/s, peak bytes, wall seconds,
    seconds of the samples' prefills, question chunks included, mean prompt tokens)."""
    samples, prompts, rows = cell_rows(model, settings)
    reset_peak_memory(model.device)
    start = time.perf_counter()
    out = dict(decode_rows(rows, batch))
    seconds = time.perf_counter() - start
    peak = peak_device_bytes(model.device) if model.device.type == "cuda" else peak_rss_bytes()
    prefill = sum(r.prefill_seconds for r in out.values())
    mean_prompt = statistics.mean(p.shape[1] for p in prompts)
    tokens = [out[i].tokens for i in range(len(samples))]
    return tokens, len(samples) / seconds, peak, seconds, prefill, mean_prompt


def main() -> None:
    args = parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if batches[0] != 1:
        sys.exit("error: --batches must start with 1 (the reference every batch is checked against)")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        base = [f"model={args.model}", "task=xsum", f"task.limit={args.limit}", f"device={args.device}"]
        model = load_model(compose("config", overrides=base).model, args.device)
        out = {"device": device_info(model.device), "args": vars(args), "cells": {}}
        torch.set_grad_enabled(False)
        differ, runs = [], {}
        for name in presets(args.methods):
            cfg = compose("config", overrides=[*base, f"method={name}", f"budget={args.budget}"])
            settings = runs[name] = read_settings(cfg)
            reference = None
            for batch in batches:
                tokens, rate, peak, wall, prefill, prompt_tokens = run_cell(model, settings, batch)
                reference = tokens if reference is None else reference
                same = tokens == reference
                if not same:
                    differ.append(f"{name} batch {batch}")
                out["cells"][f"{name}/{batch}"] = {
                    "method": name, "batch_size": batch, "samples_per_s": rate, "peak_bytes": peak,
                    "wall_s": wall, "prefill_s": prefill,
                    "same_tokens_as_batch_1": same,
                    "samples_differing": sum(a != b for a, b in zip(tokens, reference, strict=True)),
                }  # fmt: skip
                timing = f"{rate:6.3f} samples/s ({wall:.1f} s, prefill {prefill:.1f} s)"
                print(f"{name:<26} batch {batch:>2}: {timing}, peak {peak / 2**30:5.2f} GiB, "
                      f"same tokens as batch 1: {same}", flush=True)  # fmt: skip
                if args.json:
                    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.json).write_text(json.dumps(out, indent=2))
    if not args.skip_timing:
        print_table(out, batches)
        print_ceilings(model, out, batches[-1], round(prompt_tokens))
        for name, settings in runs.items():
            one, big = step_times(model, settings, batches[-1])
            ratio = batches[-1] * one / big
            out["ceiling"][f"step_{name}"] = {
                "batch_1_ms": one,
                f"batch_{batches[-1]}_ms": big,
                "ratio": ratio,
            }
            print(f"one step of {name}'s first {batches[-1]} rows {big:.1f} ms, of its first row alone "
                  f"{one:.1f} ms: {ratio:.2f}x")  # fmt: skip
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
    if differ:
        print("predictions differ from batch 1: " + ", ".join(differ))
        sys.exit(1)


def print_ceilings(model, out: dict, batch: int, prompt_tokens: int) -> None:
    """Print (and store in ``out["ceiling"]``) the decode part's ceiling ``c`` with 16 and with
    ``prompt_tokens`` cached (:func:`forward_ceiling`), and each method's whole-run ceilings: Amdahl's
    law over its batch-1 prefill share ``p``, ``1 / (p + (1 - p) / c)``, for both ``c``."""
    ceilings = {}
    for context in (16, prompt_tokens):
        one, big = forward_ceiling(model, batch, context=context)
        ceilings[context] = batch * one / big
        out.setdefault("ceiling", {})[f"context_{context}"] = {
            "batch_1_ms": one, f"batch_{batch}_ms": big, "ratio": ceilings[context],
        }  # fmt: skip
        print(f"ceiling of the decode part, {context} tokens cached: the model's forward at batch {batch} "
              f"{big:.1f} ms, at batch 1 {one:.1f} ms: at most {ceilings[context]:.2f}x")  # fmt: skip
    for name in dict.fromkeys(c["method"] for c in out["cells"].values()):
        one = out["cells"][f"{name}/1"]
        share = one["prefill_s"] / one["wall_s"]
        whole = {context: 1 / (share + (1 - share) / c) for context, c in ceilings.items()}
        out["ceiling"][f"whole_{name}"] = whole
        bounds = ", ".join(f"{w:.2f}x ({context} cached)" for context, w in whole.items())
        print(f"ceiling of the whole run, {name} (prefill {share:.0%} of batch 1): at most {bounds}")


def step_times(model, settings: RunSettings, batch: int, steps: int = 10) -> tuple[float, float]:
    """Median ms of one decode step of the first sample's row alone and of the first ``batch`` samples'
    rows together (``runners.generation.model_run.forward_rows``), alternating after 3 untimed pairs: the
    cache's batching without the run's draining batch (each step appends a token to every row it runs)."""
    runs = [start().run for _, start in cell_rows(model, settings, batch)[2]]
    tokens = torch.full((batch,), 100, device=model.device)
    times = {1: [], batch: []}
    for i in range(steps + 3):
        for b in times:
            start = time.perf_counter()
            runs[0].step(tokens[:1]) if b == 1 else forward_rows(model, runs, tokens)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                times[b].append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1]), statistics.median(times[batch])


def forward_ceiling(model, batch: int, steps: int = 20, context: int = 16) -> tuple[float, float]:
    """Median ms of the model's one-token forward at batch 1 and at ``batch`` (transformers' SDPA
    attention, a ``context``-token ``DynamicCache`` cropped back after each step), calls alternating."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    caches, times, keyword = {}, {1: [], batch: []}, cache_keyword(model)
    for b in times:
        caches[b] = DynamicCache()
        model(input_ids=torch.randint(100, 1000, (b, context), device=model.device), **{keyword: caches[b]})
    for i in range(steps + 3):
        for b, cache in caches.items():
            token = torch.full((b, 1), 100, device=model.device)
            start = time.perf_counter()
            model(input_ids=token, logits_to_keep=1, **{keyword: cache})
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:  # 3 untimed warm-up steps
                times[b].append((time.perf_counter() - start) * 1e3)
            cache.crop(-1)
    model.set_attn_implementation(implementation)
    return statistics.median(times[1]), statistics.median(times[batch])


def print_table(out: dict, batches: list[int]) -> None:
    """Markdown: one row per method, samples/s per batch, speed-up of the largest batch over batch 1."""
    head = " | ".join(f"batch {b} samples/s" for b in batches)
    last = batches[-1]
    print(f"\n| method | {head} | batch {last} / batch 1 | decode part: batch {last} / batch 1 | "
          f"prefill share (batch {last}) | peak GiB (batch {last}) |")  # fmt: skip
    print("|---|" + "---:|" * (len(batches) + 4))
    names = dict.fromkeys(c["method"] for c in out["cells"].values())
    for name in names:
        rates = [out["cells"][f"{name}/{b}"]["samples_per_s"] for b in batches]
        one, big = out["cells"][f"{name}/1"], out["cells"][f"{name}/{last}"]
        decode = (one["wall_s"] - one["prefill_s"]) / (big["wall_s"] - big["prefill_s"])
        cells = " | ".join(f"{r:.3f}" for r in rates)
        print(f"| {name} | {cells} | {rates[-1] / rates[0]:.2f}x | {decode:.2f}x | "
              f"{big['prefill_s'] / big['wall_s']:.0%} | {big['peak_bytes'] / 2**30:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
