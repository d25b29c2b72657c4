"""Efficiency measurement: timed batched generation, KV bytes vs slot counts, buffers that hold
no more than the budget, the efficiency record, shadow caches and the process peak (the OOM search:
test_oom_search.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from methods import H2O, METHOD_REGISTRY, CompressedLayer, FullKV, ZSMerge
from methods.seam.architecture import layer_specs
from methods.seam.step import prefill_step
from runners.generation.greedy import greedy_generate
from runners.measure.efficiency import measure, summarise
from runners.measure.timing import Decoder, TimedRun, timed_generate
from runners.setup.options import EfficiencyOptions
from tests.method_settings import BYTES_PER_SLOT, SETTINGS

PROMPT, STEPS = 48, 10


def prompts(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (batch, PROMPT), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_batch_rows_equal_their_single_prompt_runs(tiny_model, name):
    """Equal-length prompts in one batch: every row generates what it generates alone."""
    kwargs = SETTINGS[name][1]
    method = METHOD_REGISTRY[name](**kwargs)
    budget = 12 if method.traits.compresses else None
    batch = timed_generate(tiny_model, prompts(3), METHOD_REGISTRY[name](**kwargs), budget, STEPS)
    for row in range(3):
        alone = greedy_generate(
            tiny_model, prompts(3)[row : row + 1], METHOD_REGISTRY[name](**kwargs), budget, STEPS + 1, set()
        )
        assert batch.tokens[row].tolist() == alone.tokens, f"row {row}"


def test_decoders_sharing_one_prefill_decode_as_their_own(tiny_model):
    """``Decoder.shared`` (one FullKV prefill forward fanned out to every setting's cache): each
    setting's tokens and slot counts are those of its own decoder, FullKV's cache holds the prompt
    once (it is the forward's own), and a probing method is refused before any work."""
    ids = prompts(2)
    settings = [(FullKV(), None), (ZSMerge(), 12), (H2O(), 12)]
    shared = Decoder.shared(tiny_model, ids, settings, PROMPT + STEPS + 1)
    alone = [Decoder(tiny_model, ids, type(m)(), b, PROMPT + STEPS + 1) for m, b in settings]
    for _ in range(STEPS):
        for decoder in (*shared, *alone):
            decoder.step()
    for ours, theirs in zip(shared, alone, strict=True):
        assert torch.equal(torch.stack(ours.tokens), torch.stack(theirs.tokens))
        assert ours.cache.n_slots == theirs.cache.n_slots
    assert shared[0].cache.n_slots[0] == PROMPT + STEPS and shared[1].cache.n_slots[0] <= 12
    with pytest.raises(ValueError, match="probing"):
        Decoder.shared(tiny_model, ids, [(METHOD_REGISTRY["kvzip"](), 12)])


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_timings_positive_and_kv_bytes_match_slots(tiny_model, name):
    method = METHOD_REGISTRY[name](**SETTINGS[name][0])
    budget = 20 if method.traits.compresses else None
    run = timed_generate(tiny_model, prompts(2), method, budget, STEPS)
    assert run.prefill_seconds > 0 and len(run.step_seconds) == STEPS and min(run.step_seconds) > 0
    aux = 0  # state standing in for evicted tokens, per layer: batch x kv_heads x ... x 4 bytes (fp32)
    if name == "less":  # H [R, head_dim] + z [R]
        aux = 2 * (2 * 2 * (8 * 16 + 8) * 4)
    if name == "streamingllm":  # the 4 sinks' original keys, re-rotated at each step
        aux = 2 * (2 * 2 * 4 * 16 * 4)
    if name == "expected_attention":  # query statistics per query head (mean + scatter triangle), R_bar
        aux = 2 * (2 * 6 * (16 + 16 * 17 // 2) * 4 + 2 * 16 * 4)
    per_slot = BYTES_PER_SLOT // 2 * (3 if name == "think" else 4) // 4  # ThinK: keys on half their channels
    assert run.kv_bytes == sum(run.held_slots) * per_slot + aux  # every head of the batch, exact
    assert run.fullkv_bytes == 2 * 2 * (PROMPT + STEPS) * BYTES_PER_SLOT  # batch x layers x tokens
    assert run.allocated_bytes >= run.kv_bytes
    if method.traits.compresses and method.traits.holds_in_decode:
        assert max(run.slots) <= budget


def test_progress_bar_counts_every_forward_of_warmup_and_repeats(tiny_model, monkeypatch):
    """The bar's total is the forwards measure() runs (prefill + decode steps, warm-up included) and
    it ends full, not at a count of repeats; the hook is removed afterwards."""
    import runners.measure.efficiency

    bars = []

    class Recorder(runners.measure.efficiency.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(runners.measure.efficiency, "tqdm", Recorder)
    runner = {"batch_size": 1, "prompt_len": PROMPT, "gen_len": 6, "warmup_steps": 2, "repeats": 3,
              "curve_every": 0, "progress": True}  # fmt: skip
    efficiency, _ = measure(tiny_model, H2O(), EfficiencyOptions(**runner), 0, 20)
    forwards = 3 + 3 * 6  # warm-up: prefill + 2 steps; each repeat: prefill + 5 steps
    assert [(bar.n, bar.total) for bar in bars] == [(forwards, forwards)]
    assert not tiny_model._forward_hooks and len(efficiency["prefill_seconds_all"]) == 3


@pytest.mark.parametrize("method", [H2O(), ZSMerge()])
def test_buffers_hold_at_most_one_slot_over_budget(method):
    """Preallocated buffers are sized budget + 1 (the appended token before eviction): memory of
    evicted tokens is really gone, not masked."""
    layer = CompressedLayer(method.traits.state_fill, 16)
    layer.update(torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8))
    prefill_step(method, layer, torch.randn(1, 6, 64, 8), None, None, 0.3)
    per_slot = 2 * 2 * 8 * 4  # kv_heads x (K, V) x head_dim x fp32
    for _ in range(40):
        layer.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        method.decode_step(layer, torch.softmax(torch.randn(1, 2, layer.store.n_slots), -1))
        assert layer.store.n_slots <= 16
        assert (
            layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes() == 17 * per_slot
        )
    assert layer.store.allocated_bytes() < 64 * per_slot


def test_fullkv_buffer_grows_geometrically_and_keeps_every_token():
    layer = CompressedLayer(FullKV().traits.state_fill, None)
    keys = torch.randn(1, 2, 300, 8)
    layer.update(keys[:, :, :10], keys[:, :, :10])
    prefill_step(FullKV(), layer, torch.randn(1, 2, 10, 8), None, None, 1.0)
    storages = set()
    for i in range(10, 300):
        layer.update(keys[:, :, i : i + 1], keys[:, :, i : i + 1])
        storages.add(layer.keys.untyped_storage().data_ptr())
    assert torch.equal(layer.keys, keys) and layer.store.positions[0, 0].tolist() == list(range(300))
    assert len(storages) <= 8  # a handful of reallocations for 290 appends, not one per step


def fake_run(prefill: float, steps: list[float]) -> TimedRun:
    return TimedRun(prefill, steps, 100, 120, 10, 400, [5, 5], [20, 20], [], torch.zeros(2, len(steps) + 1))


def test_summary_is_the_median_over_repeats():
    runs = [fake_run(1.0, [0.1] * 4), fake_run(3.0, [0.3] * 4), fake_run(2.0, [0.2] * 4)]
    eff = summarise(runs, batch_size=2, prompt_len=50, peaks=[7, 9, None])
    assert eff["prefill_seconds"] == 2.0 and math.isclose(eff["decode_seconds"], 0.8)
    assert math.isclose(eff["latency_seconds"], 2.8)
    assert math.isclose(eff["decode_tokens_per_s"], 2 * 4 / 0.8)
    assert math.isclose(eff["tokens_per_s"], 2 * 5 / 2.8)  # batch x (1 + steps) tokens per latency
    assert math.isclose(eff["prefill_tokens_per_s"], 2 * 50 / 2.0)
    assert math.isclose(eff["decode_step_ms_median"], 200.0)
    assert eff["peak_memory_bytes"] == 9 and eff["kv_fraction_of_fullkv"] == 0.25


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["runner=efficiency", "runner.prompt_len=8000", "runner.gen_len=500"], "exceeds the context"),
        (["runner=efficiency", "runner.batch_size=0"], "runner.batch_size must be a positive integer"),
        (["runner=oom", "runner.search=width"], "runner.search must be one of"),
        (["runner=oom", "runner.low=9", "runner.high=4"], "runner.low <= runner.high"),
        (["runner=oom", "runner.device=auto"], "runner.device must be cpu or cuda[:N], got 'auto'"),
        (["runner=error", "runner.budgets=[]"], "runner.budgets is empty"),
        (["runner=error", "method=fullkv"], "has no error"),
        (["runner=error", "method=kvzip"], "scores with forwards of its own"),
    ],
)
def test_bad_runner_input_is_one_error_line(run_py, overrides, message):
    proc = run_py(*overrides)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert "loading model" not in proc.stdout


@pytest.mark.integration
def test_efficiency_runner_record_on_the_embedded_model(tmp_path, run_py):
    proc = run_py(
        "runner=efficiency", "method=h2o", "budget=0.25", "runner.prompt_len=64",
        "runner.gen_len=9", "runner.batch_size=2", "runner.repeats=2", "runner.warmup_steps=2",
        "runner.curve_every=4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads(next((tmp_path / "results" / "runs").glob("*/record.json")).read_text())
    eff = record["efficiency"]
    assert record["status"] == "ok" and record["shape"] == {"prompt_len": 64, "gen_len": 9, "batch_size": 2}
    for key in ("prefill_seconds", "decode_seconds", "latency_seconds", "tokens_per_s", "decode_tokens_per_s",
                "prefill_tokens_per_s", "decode_step_ms_median", "peak_memory_bytes"):  # fmt: skip
        assert eff[key] > 0, key
    per_slot = 30 * 3 * 64 * 2 * 4  # SmolLM2: layers x KV heads x head_dim x (K, V) x fp32
    assert record["budget_slots"] == 16 and eff["slots_end"] == 16
    assert eff["kv_bytes_end"] == 2 * 16 * per_slot and eff["fullkv_bytes_end"] == 2 * (64 + 8) * per_slot
    assert [p["context"] for p in record["curve"]] == [68, 72]
    assert all(p["kv_bytes"] == 2 * 16 * per_slot for p in record["curve"])


@pytest.mark.parametrize("name", ["h2o", "zsmerge", "keepkv", "streamingllm"])
def test_shadow_caches_measure_zero_error_at_a_covering_budget(tiny_model, name):
    """A shadow cache that keeps everything reproduces FullKV's attention output; a small budget
    does not (the error runner's measurement, ZSMerge Figure 4)."""
    from runners.measure.attention_error import ShadowCaches

    method = METHOD_REGISTRY[name]()
    shadows = ShadowCaches(method, [PROMPT + STEPS, 8], layer_specs(tiny_model))
    greedy_generate(tiny_model, prompts(1), FullKV(), None, STEPS, set(), observer=shadows)
    assert torch.equal(shadows.steps, torch.full((2, 2), STEPS - 1.0))  # every decode step, every layer
    error = shadows.error_sum / shadows.steps
    assert error[0].max() < 1e-5 and error[1].min() > 1e-3


def test_process_peak_keeps_what_a_run_window_leaves_out():
    """Memory touched before a run's window (model loading) is out of the run's peak and in the
    process peak (``runners.output.environment``, as quality and efficiency records report them)."""
    from runners.output.environment import peak_rss_bytes, process_peak_rss_bytes, reset_peak_memory

    loading = torch.ones(2**25)  # 128 MiB touched, then freed: the loading transient
    loading.add_(1)
    del loading
    before = peak_rss_bytes()
    reset_peak_memory(torch.device("cpu"))
    run = peak_rss_bytes()
    assert run < before - 64 * 2**20  # the window was reset
    assert process_peak_rss_bytes() >= before
