"""What a quality run records (``runners.quality``, ``runners.sweeps.quality_grid``): each sample's
line of ``predictions.jsonl`` and the record's scores and efficiency block (timings, KV bytes, kept
fractions, peak memory)."""

from __future__ import annotations

import statistics

import torch

from runners.generation.greedy import GenerationResult
from runners.output.environment import (
    peak_device_bytes,
    peak_rss_bytes,
    process_peak_device_bytes,
    process_peak_rss_bytes,
)
from tasks import Task


def efficiency_block(results: list[GenerationResult], prompt_lens: list[int], device: torch.device) -> dict:
    """The record's efficiency block over a run's ``results`` (``prompt_lens`` tokens each) on
    ``device``: prefill and decode timings, KV and state bytes at the end, the prefill's kept
    fractions and head slots, counters summed, peak memory."""
    prefill_s = sum(r.prefill_seconds for r in results)
    steps = [s for r in results for s in r.step_seconds]
    n = len(results)
    kept_fractions = [
        [s / r.prefill_tokens for s in r.prefill_slots] for r in results
    ]  # of the tokens the prefill compressed (the context of a query-agnostic run)
    counters = {f"{name}_total": sum(r.counters[name] for r in results) for name in results[0].counters}
    return counters | {
        "prefill_seconds_sum": prefill_s,
        "decode_seconds_sum": sum(steps),
        "prefill_tokens_per_s": sum(prompt_lens) / prefill_s if prefill_s else None,
        "decode_tokens_per_s": len(steps) / sum(steps) if steps else None,
        "decode_step_ms_median": 1000 * statistics.median(steps) if steps else None,
        "prompt_tokens_mean": sum(prompt_lens) / n,
        "generated_tokens_mean": sum(len(r.tokens) for r in results) / n,
        "budget_slots_mean": (sum(r.budget for r in results) / n) if results[0].budget is not None else None,
        "kv_bytes_end_mean": sum(r.kv_bytes for r in results) / n,
        "allocated_bytes_end_mean": sum(r.allocated_bytes for r in results) / n,
        "fullkv_bytes_end_mean": sum(r.fullkv_bytes for r in results) / n,
        "kv_fraction_of_fullkv": sum(r.kv_bytes for r in results) / sum(r.fullkv_bytes for r in results),
        "state_bytes_end_mean": sum(r.state_bytes for r in results) / n,
        "prefill_kept_fraction": sum(sum(kept) / len(kept) for kept in kept_fractions) / n,
        "prefill_kept_fraction_per_layer": [sum(col) / n for col in zip(*kept_fractions, strict=True)],
        # slots per KV head after the prefill, over every layer and sample: the heads' spread
        "prefill_head_slots_min": min(s[0] for r in results for s in r.prefill_head_slots),
        "prefill_head_slots_mean": statistics.fmean(s[1] for r in results for s in r.prefill_head_slots),
        "prefill_head_slots_max": max(s[2] for r in results for s in r.prefill_head_slots),
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_rss_process_bytes": process_peak_rss_bytes(),
        "peak_device_bytes": peak_device_bytes(device),
        "peak_device_process_bytes": process_peak_device_bytes(device),
    }


def prediction_row(tokenizer, sample, ids: torch.Tensor, start: int | None, res: GenerationResult) -> dict:
    """The line a quality run stores for one sample (``predictions.jsonl``)."""
    return {
        "id": sample.id,
        "prediction": tokenizer.decode(res.tokens, skip_special_tokens=True).strip(),
        "references": sample.references,
        "meta": sample.meta,
        "prompt_tokens": ids.shape[1],
        "question_start": start,
        "generated_tokens": len(res.tokens),
        "budget_slots": res.budget,
        "slots_end": res.slots[0],
        "kv_bytes_end": res.kv_bytes,
        "allocated_bytes_end": res.allocated_bytes,
        "prefill_head_slots": [list(s) for s in res.prefill_head_slots],
        "fullkv_bytes_end": res.fullkv_bytes,
        "prefill_seconds": res.prefill_seconds,
        "decode_seconds": sum(res.step_seconds),
    }


def close_record(
    record: dict,
    task: Task,
    samples: list,
    prompts: list,
    results: list[GenerationResult],
    predictions: list[dict],
    device: torch.device,
) -> None:
    """Score the predictions (each line gets its ``metrics``) and set the record's status, metrics
    and efficiency."""
    metrics, per_sample = task.score([p["prediction"] for p in predictions], samples)
    for p, m in zip(predictions, per_sample, strict=True):
        p["metrics"] = m
    record.update(
        status="ok",
        metrics=metrics,
        efficiency=efficiency_block(results, [p.shape[1] for p in prompts], device),
    )
