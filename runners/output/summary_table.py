"""The short table printed at the end of a run."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

#: A figure the record does not carry (another runner's, or another device's): its row is not shown.
ABSENT = object()
#: Rows of CUDA figures, shown for CUDA runs only.
VRAM_ROWS = ("peak VRAM MiB (run)", "peak VRAM MiB (process, with loading)")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mib(value):
    if value is ABSENT:
        return ABSENT
    return value / 2**20 if value else None


def _get(source: dict, *keys: str):
    """The value of the first of ``keys`` in ``source`` (None included), else :data:`ABSENT`."""
    return next((source[key] for key in keys if key in source), ABSENT)


def summary_title(record: dict) -> str:
    """The table's title, one short line per group (rich wraps a title only between words, so no
    line is cut inside a name): method on task, model and budget, samples (or the efficiency
    runner's prompt shape ``prompt + gen x batch``), status."""
    cfg = record.get("config") or {}
    shape = record.get("shape")
    size = (
        f"prompt {shape['prompt_len']} + gen {shape['gen_len']} tokens x batch {shape['batch_size']}"
        if shape
        else f"{record.get('n_samples')} samples"
    )
    lines = [
        f"{record.get('method')} on {record.get('task')}",
        f"model {(cfg.get('model') or {}).get('name')} | budget {cfg.get('budget')}",
        f"{size} | status {record['status']}",
    ]
    return "\n".join(lines)


def summary_table(record: dict) -> Table:
    """The rich table :func:`print_summary` prints: labels never wrap, numbers are never cut (they
    fold only if the console is narrower than the number), text values (the error) wrap at words.
    A row is shown where the record carries its figure (VRAM on CUDA only), each figure once: the
    peak memory row is the efficiency runner's own measure (VRAM on CUDA, else RSS, of its timed
    repeats); other runners' peaks are their RSS and VRAM rows."""
    eff = record.get("efficiency") or {}
    metrics = record.get("metrics") or {}
    cuda = (record.get("device") or {}).get("type") == "cuda"
    table = Table(title=summary_title(record))
    table.add_column("metric", no_wrap=True, min_width=12)
    table.add_column("value", justify="right", overflow="fold", min_width=10)
    for key, value in metrics.items():
        table.add_row(key, _fmt(value, ".2f"))
    rows = [
        ("latency s (prefill + decode)", _get(eff, "latency_seconds"), ".2f"),
        ("prefill tokens/s", _get(eff, "prefill_tokens_per_s"), ".1f"),
        ("decode tokens/s", _get(eff, "decode_tokens_per_s"), ".1f"),
        ("decode step ms (median)", _get(eff, "decode_step_ms_median"), ".1f"),
        ("decode step ms (p90)", _get(eff, "decode_step_ms_p90"), ".1f"),
        ("budget slots (mean)", _get(eff | record, "budget_slots_mean", "budget_slots"), ".1f"),
        ("KV bytes at end (mean)", _get(eff, "kv_bytes_end_mean", "kv_bytes_end"), ",.0f"),
        ("FullKV bytes, same tokens (mean)", _get(eff, "fullkv_bytes_end_mean", "fullkv_bytes_end"), ",.0f"),
        ("KV fraction of FullKV", _get(eff, "kv_fraction_of_fullkv"), ".3f"),
        ("KV bytes allocated at end (mean)", _get(eff, "allocated_bytes_end_mean"), ",.0f"),
        ("slots per KV head after prefill: min", _get(eff, "prefill_head_slots_min"), ",d"),
        ("slots per KV head after prefill: mean", _get(eff, "prefill_head_slots_mean"), ",.1f"),
        ("slots per KV head after prefill: max", _get(eff, "prefill_head_slots_max"), ",d"),
        ("prompt kept after prefill", _get(eff, "prefill_kept_fraction"), ".3f"),
        ("peak RSS MiB (run)", _mib(_get(eff, "peak_rss_bytes")), ".0f"),
        ("peak memory MiB (VRAM or RSS)", _mib(_get(eff, "peak_memory_bytes")), ".0f"),
        ("peak VRAM MiB (run)", _mib(_get(eff, "peak_device_bytes")), ".0f"),
        ("peak RSS MiB (process, with loading)", _mib(_get(eff, "peak_rss_process_bytes")), ".0f"),
        ("peak VRAM MiB (process, with loading)", _mib(_get(eff, "peak_device_process_bytes")), ".0f"),
        ("wall seconds", _get(record, "wall_seconds"), ".1f"),
    ]
    rows += [(key.removesuffix("_total").replace("_", " "), value, ",d") for key, value in eff.items()
             if key.endswith("_total")]  # fmt: skip
    for label, value, spec in rows:
        if value is not ABSENT and (cuda or label not in VRAM_ROWS):
            table.add_row(label, _fmt(value, spec))
    if record.get("error"):
        table.add_row("error", Text(record["error"], justify="left"))  # wraps at words
    table.add_row("record", f"runs/{record['run_id']}/record.json")
    return table


def print_summary(record: dict) -> None:
    """Print quality, throughput, KV bytes vs FullKV and peak memory of one run record (a table
    that fits the console: rich measures its width, so the terminal never breaks a line mid-word)."""
    Console().print(summary_table(record))
