"""Efficiency runner (``runner=efficiency``): prefill and decode timings, tokens/s, latency, KV
bytes and peak memory of one method on synthetic prompts of a given shape.

ZSMerge Table 1/4 shapes (``prompt_len + gen_len x batch``) are one run each; Figure 3's
context-growth curve is ``runner.curve_every=N`` (a point every N decode steps). Prompts are
random token ids, equal length within a batch (no padding, so every slot of the budget holds a
real token). Each timed repeat is a fresh cache: prefill, then ``gen_len - 1`` decode steps (the
prefill yields the first token), after an untimed warm-up; figures are medians over repeats and
peak memory is the maximum over them (CUDA ``max_memory_allocated``; CPU peak RSS of this process,
its high-water mark reset before each repeat where Linux allows it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from tqdm import tqdm

from methods import CompressionMethod
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.measure.timing import TimedRun, synthetic_prompts, timed_generate
from runners.models.loading import load_model
from runners.output.environment import (
    peak_device_bytes,
    peak_rss_bytes,
    process_peak_device_bytes,
    process_peak_rss_bytes,
    reset_peak_memory,
)
from runners.output.record import new_record, recording, run_config, stored_run
from runners.output.summary_table import print_summary
from runners.results.store import ResultStore
from runners.setup.budget import resolve_budget
from runners.setup.build import build_method, run_budget
from runners.setup.options import EfficiencyOptions
from runners.setup.quant_kind import storage_of
from runners.setup.settings import RunSettings
from tasks.errors import KVBenchError


def check_shape(settings: RunSettings) -> None:
    """Validate the runner's shape before any work.

    Raises
    ------
    KVBenchError
        For a prompt + generation longer than the model's context
        (``model.max_context``, filled from the model's config by ``runners.setup.build.build_method``).
    """
    r, model = settings.runner, settings.model  # each size a positive integer (EfficiencyOptions)
    if r.prompt_len + r.gen_len > model.max_context:
        raise KVBenchError(
            f"prompt_len {r.prompt_len} + gen_len {r.gen_len} exceeds the context of {model.name} "
            f"({model.max_context} tokens)"
        )


def start_synthetic_run(
    settings: RunSettings, check: Callable[[RunSettings], None]
) -> tuple[CompressionMethod, StorageKind, dict, ResultStore, str, dict | None]:
    """The start of a runner on synthetic prompts (``runner=efficiency``, ``runner=oom``): the method
    (which fills ``model.max_context`` from the model's config), its storage kind
    (``runners.setup.quant_kind.storage_of``), the runner's own ``check(settings)``, then
    the run's config, store, id and finished record (:func:`runners.output.record.stored_run`; None when it
    is to be computed).

    Raises
    ------
    KVBenchError
        For bad input (budget, method, the runner's fields), before the model is loaded.
    """
    method = build_method(settings)
    storage = storage_of(settings, method)
    check(settings)
    config = run_config(settings.config, method.traits.budget_applies)
    return method, storage, config, *stored_run(settings.config, config, print_summary)


def summarise(runs: list[TimedRun], batch_size: int, prompt_len: int, peaks: list[int | None]) -> dict:
    """Medians over repeats of one shape: the efficiency block of the record.

    Throughput follows ZSMerge Table 1: generated tokens (batch_size x gen_len) over the latency
    (prefill + decode, seconds); decode tokens/s counts decode steps only.
    """
    prefill = statistics.median(r.prefill_seconds for r in runs)
    decode = statistics.median(sum(r.step_seconds) for r in runs)
    steps = [s for r in runs for s in r.step_seconds]
    n_steps = len(runs[0].step_seconds)
    last = runs[-1]
    peak = [p for p in peaks if p is not None]
    return {
        "prefill_seconds": prefill,
        "decode_seconds": decode,
        "latency_seconds": prefill + decode,
        "prefill_tokens_per_s": batch_size * prompt_len / prefill,
        "decode_tokens_per_s": batch_size * n_steps / decode if n_steps else None,
        "tokens_per_s": batch_size * (n_steps + 1) / (prefill + decode),
        "decode_step_ms_median": 1000 * statistics.median(steps) if steps else None,
        "decode_step_ms_p90": 1000 * statistics.quantiles(steps, n=10)[-1] if len(steps) > 1 else None,
        "prefill_seconds_all": [r.prefill_seconds for r in runs],
        "decode_seconds_all": [sum(r.step_seconds) for r in runs],
        "kv_bytes_end": last.kv_bytes,
        "allocated_kv_bytes_end": last.allocated_bytes,
        "state_bytes_end": last.state_bytes,
        "fullkv_bytes_end": last.fullkv_bytes,
        "kv_fraction_of_fullkv": last.kv_bytes / last.fullkv_bytes,
        "slots_end": last.slots[0],
        "peak_memory_bytes": max(peak) if peak else None,
    }


def measure(
    model: torch.nn.Module,
    method: CompressionMethod,
    r: EfficiencyOptions,
    seed: int,
    budget: int | None,
    storage: StorageKind = SlotStore,
) -> tuple[dict, list[dict]]:
    """Warm-up, then ``r.repeats`` timed runs of the shape of ``r`` (the runner's options; prompts
    drawn with ``seed``; caches of the run's ``storage`` kind); the efficiency block and the curve.

    The progress bar (``runner.progress``) advances once per model forward, the prefill and every
    decode step of the warm-up and of each repeat (a forward hook: a counter increment per step)."""
    device = model.device
    ids = synthetic_prompts(model.config.vocab_size, r.batch_size, r.prompt_len, seed).to(device)
    warmup = min(r.warmup_steps, r.gen_len - 1)
    total = (1 + warmup if r.warmup_steps else 0) + r.repeats * r.gen_len
    runs, peaks = [], []
    with tqdm(total=total, desc=f"{method.label} prefill+decode", unit="step", disable=not r.progress) as bar:

        def advance(*_) -> None:  # a forward hook's return value would replace the model's output
            bar.update()

        hook = model.register_forward_hook(advance) if r.progress else None
        try:
            if r.warmup_steps:
                timed_generate(model, ids, method, budget, warmup, storage=storage)
            for i in range(r.repeats):
                reset_peak_memory(device)
                curve_every = r.curve_every if i == 0 else 0
                runs.append(timed_generate(model, ids, method, budget, r.gen_len - 1, curve_every, storage))
                peaks.append(peak_device_bytes(device) if device.type == "cuda" else peak_rss_bytes())
        finally:
            if hook is not None:
                hook.remove()
    return summarise(runs, r.batch_size, r.prompt_len, peaks), runs[0].curve


def run_efficiency(settings: RunSettings) -> dict:
    """Run (or reuse) the efficiency measurement of ``settings`` and return its record.

    Raises
    ------
    KVBenchError
        For bad input (budget, method, shape), before the model is loaded.
    """
    method, storage, config, store, rid, done = start_synthetic_run(settings, check_shape)
    if done is not None:
        return done
    print(f"loading model {settings.model.name}", flush=True)
    model = load_model(settings.model, settings.device)
    r = settings.runner
    budget = resolve_budget(
        run_budget(settings, method), r.prompt_len, settings.model.max_context, settings.budget_unit
    )
    record = new_record(
        rid, config, method.label, "synthetic", model.device,
        shape={"prompt_len": r.prompt_len, "gen_len": r.gen_len, "batch_size": r.batch_size},
        budget_slots=budget, n_samples=r.batch_size,
    )  # fmt: skip
    with recording(settings.config, store, record):
        efficiency, curve = measure(model, method, r, settings.seed, budget, storage)
        efficiency |= {  # the process: model loading and the warm-up included
            "peak_rss_process_bytes": process_peak_rss_bytes(),
            "peak_device_process_bytes": process_peak_device_bytes(model.device),
        }
        record.update(
            status="ok", metrics={"tokens_per_s": efficiency["tokens_per_s"]}, efficiency=efficiency
        )
        record["curve"] = curve
    print_summary(record)
    return record
