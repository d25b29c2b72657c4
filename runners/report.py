"""The short table printed at the end of a run."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_summary(record: dict) -> None:
    """Print quality, throughput, KV bytes vs FullKV and peak memory of one run record."""
    eff = record.get("efficiency") or {}
    metrics = record.get("metrics") or {}
    cfg = record.get("config", {})
    title = (
        f"{record.get('method')} on {record.get('task')} | model {cfg.get('model', {}).get('name')} | "
        f"budget {cfg.get('budget')} | {record.get('n_samples')} samples | status {record['status']}"
    )
    table = Table(title=title)
    for name in ("metric", "value"):
        table.add_column(name)
    for key, value in metrics.items():
        table.add_row(key, _fmt(value, ".2f"))
    shape = record.get("shape")
    if shape:
        title += f" | {shape['prompt_len']}+{shape['gen_len']} x batch {shape['batch']}"
    rows = [
        ("latency s (prefill + decode)", eff.get("latency_seconds"), ".2f"),
        ("prefill tokens/s", eff.get("prefill_tokens_per_s"), ".1f"),
        ("decode tokens/s", eff.get("decode_tokens_per_s"), ".1f"),
        ("decode step ms (median)", eff.get("decode_step_ms_median"), ".1f"),
        ("decode step ms (p90)", eff.get("decode_step_ms_p90"), ".1f"),
        ("budget slots (mean)", eff.get("budget_slots_mean", record.get("budget_slots")), ".1f"),
        ("KV bytes at end (mean)", eff.get("kv_bytes_end_mean", eff.get("kv_bytes_end")), ",.0f"),
        (
            "FullKV bytes, same tokens (mean)",
            eff.get("fullkv_bytes_end_mean", eff.get("fullkv_bytes_end")),
            ",.0f",
        ),
        ("KV fraction of FullKV", eff.get("kv_fraction_of_fullkv"), ".3f"),
        ("prompt kept after prefill", eff.get("prefill_kept_fraction"), ".3f"),
        ("peak RSS MiB", (eff.get("peak_rss_bytes") or 0) / 2**20 or None, ".0f"),
        ("peak memory MiB (VRAM or RSS)", (eff.get("peak_memory_bytes") or 0) / 2**20 or None, ".0f"),
        ("wall seconds", record.get("wall_seconds"), ".1f"),
    ]
    rows += [(key.removesuffix("_total").replace("_", " "), value, ",d") for key, value in eff.items()
             if key.endswith("_total")]  # fmt: skip
    for label, value, spec in rows:
        table.add_row(label, _fmt(value, spec))
    if record.get("error"):
        table.add_row("error", record["error"])
    table.add_row("record", f"runs/{record['run_id']}/record.json")
    Console(width=120).print(table)
