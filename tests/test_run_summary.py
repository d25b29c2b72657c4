"""The table printed at the end of a run (runners/output/summary_table.py): the title shows the prompt shape
and no label, number or word is broken across lines, at a wide and at a narrow console."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from runners.output.summary_table import summary_table

RECORD = {
    "run_id": "70dd256838892b96",
    "status": "error",
    "error": "RuntimeError: the cache overflowed its preallocated buffer while decoding step 1234567",
    "method": "zsmerge",
    "task": "synthetic",
    "config": {"model": {"name": "smollm2-135m"}, "budget": 64},
    "shape": {"prompt_len": 128, "gen_len": 97, "batch_size": 2},
    "n_samples": 2,
    "metrics": {"tokens_per_s": 1.95},
    "efficiency": {"kv_bytes_end": 2949120, "fullkv_bytes_end": 10321920, "latency_seconds": 49.67},
}


def render(record: dict, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(summary_table(record))
    return console.export_text()


@pytest.mark.parametrize("width", [120, 60])
def test_title_shows_the_shape_and_nothing_is_cut_mid_word(width):
    text = render(RECORD, width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "prompt 128 + gen 97 tokens x batch 2" in text and "status error" in text
    for whole in ("FullKV bytes, same tokens (mean)", "2,949,120", "10,321,920", "smollm2-135m", "49.67"):
        assert whole in text, (whole, text)
    cells = [c.strip() for line in text.splitlines() for c in re.split(r"[│┃]", line)]
    words = {w for c in cells for w in c.split()}
    for word in RECORD["error"].split():  # the error wraps between words only
        assert word in words, (word, text)


def test_a_quality_record_shows_its_sample_count():
    record = {k: v for k, v in RECORD.items() if k != "shape"} | {"status": "ok", "error": None}
    text = render(record, 100)
    assert "2 samples | status ok" in text and "error" not in text


def rows(text: str) -> dict[str, str]:
    """``label -> value`` of the rendered table's one-line rows."""
    cells = [[c.strip() for c in re.split(r"[│┃]", line)[1:-1]] for line in text.splitlines()]
    return {c[0]: c[1] for c in cells if len(c) == 2 and c[0]}


QUALITY = {  # a quality run's figures: no latency or p90 (the efficiency runner's)
    "decode_tokens_per_s": 3.2, "budget_slots_mean": 31.1, "peak_rss_bytes": 300 * 2**20,
    "peak_rss_process_bytes": 400 * 2**20, "peak_device_bytes": None, "peak_device_process_bytes": None,
}  # fmt: skip


def peaks(shown: dict[str, str]) -> dict[str, str]:
    """The peak memory rows of a rendered table."""
    return {label: value for label, value in shown.items() if label.startswith("peak ")}


def test_a_cpu_run_shows_only_its_figures_and_its_peak_rss_once():
    record = RECORD | {"status": "ok", "error": None, "device": {"type": "cpu"}, "efficiency": QUALITY,
                       "wall_seconds": 389.9}  # fmt: skip
    shown = rows(render(record, 100))
    assert peaks(shown) == {"peak RSS MiB (run)": "300", "peak RSS MiB (process, with loading)": "400"}
    assert not any("VRAM MiB (" in label or "latency" in label for label in shown), shown
    assert "-" not in shown.values(), shown


def test_a_cuda_run_shows_its_vram():
    vram = {"peak_device_bytes": 100 * 2**20, "peak_device_process_bytes": 200 * 2**20}
    record = RECORD | {"device": {"type": "cuda"}, "efficiency": QUALITY | vram}
    shown = rows(render(record, 100))
    assert peaks(shown) == {
        "peak RSS MiB (run)": "300",
        "peak VRAM MiB (run)": "100",
        "peak RSS MiB (process, with loading)": "400",
        "peak VRAM MiB (process, with loading)": "200",
    }


def test_the_efficiency_runners_own_peak_is_its_peak_memory_row():
    """The efficiency runner measures the peak of its timed repeats (VRAM on CUDA, else RSS)."""
    efficiency = {"peak_memory_bytes": 250 * 2**20, "peak_rss_process_bytes": 400 * 2**20}
    record = RECORD | {"device": {"type": "cpu"}, "efficiency": efficiency}
    assert peaks(rows(render(record, 100))) == {
        "peak memory MiB (VRAM or RSS)": "250",
        "peak RSS MiB (process, with loading)": "400",
    }
