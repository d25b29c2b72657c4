"""One prefill for a grid of settings (``runners.generation.shared_prefill``): every setting's tokens, slots
and bytes are those of its own run."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch

from methods import H2O, FullKV
from runners.generation.greedy import ModelRun, greedy_generate
from runners.generation.shared_prefill import shared_generate
from tests.architectures import tiny_family
from tests.method_settings import build_preset

PROMPT, QUESTION, NEW = 56, 8, 10
PRESETS = ("snapkv", "h2o", "streamingllm", "keepkv", "adakv_snapkv", "pyramidkv", "kvzip", "kvzip_layerwise")


def settings(budget: int) -> list:
    return [(FullKV(), None)] + [(build_preset(p), budget) for p in PRESETS]


def own_runs(model, ids, grid, start):
    return [greedy_generate(model, ids, m, b, NEW, {2}, question_start=start) for m, b in grid]


@pytest.mark.parametrize(
    ("start", "batch"), [(None, 1), (PROMPT - QUESTION, 1), (PROMPT - QUESTION, 4)],
    ids=["query_aware", "query_agnostic", "query_agnostic-decode_batch_4"],
)  # fmt: skip
def test_shared_prefill_equals_each_settings_own_run(tiny_model, start, batch):
    """Batch 4: the settings' decode steps four rows per forward (rows of different methods)."""
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    grid = settings(20)
    shared = shared_generate(tiny_model, ids, grid, NEW, {2}, question_start=start, batch_size=batch)
    own = own_runs(tiny_model, ids, settings(20), start)
    for (method, _), a, b in zip(grid, shared, own, strict=True):
        fields = ("tokens", "slots", "kv_bytes", "allocated_bytes", "prefill_slots", "prefill_head_slots")
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields], method.label
    assert len({tuple(r.tokens) for r in shared}) > 1  # the settings do differ


def test_a_grid_over_storage_kinds_equals_each_settings_own_run(tiny_model):
    """Settings of different ``quant=`` kinds (``runner.quants``) in one grid: each setting's tokens,
    slots and bytes are those of its own run over its kind (the shared forward's cache is full
    precision). One row per decode forward: the grid refuses quantized settings in batches
    (``runners.sweeps.quality_grid``)."""
    from methods.quant import storage_kind
    from methods.seam.uniform import SlotStore

    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    kinds = [
        SlotStore,
        storage_kind("int8", {}),
        storage_kind("int4", {}),
        storage_kind("kivi2", {"residual": 8, "group": 4}),
    ]
    grid = [
        (m, b)
        for m, b in ((FullKV(), None), (build_preset("snapkv"), 20), (build_preset("tova"), 20))
        for _ in kinds
    ]
    storages = [k for _ in range(3) for k in kinds]
    shared = shared_generate(
        tiny_model, ids, grid, NEW, {2}, question_start=PROMPT - QUESTION, storages=storages
    )
    for (method, budget), kind, result in zip(grid, storages, shared, strict=True):
        own = greedy_generate(
            tiny_model, ids, method, budget, NEW, {2}, question_start=PROMPT - QUESTION, storage=kind
        )
        fields = ("tokens", "slots", "kv_bytes", "allocated_bytes", "prefill_slots")
        assert [getattr(result, f) for f in fields] == [getattr(own, f) for f in fields], (method.label, kind)
    assert len({r.kv_bytes for r in shared}) >= 8  # the kinds do hold different bytes


def test_equal_prompt_scores_of_a_grid_are_computed_once(tiny_model, monkeypatch):
    """H2O at three budgets scores the prompt with the same causal column sums: computed once per
    layer (``methods.score_memo``), and each setting's run is still its own run's."""
    import methods.scoring as scoring

    computed = []
    real = scoring.remember
    monkeypatch.setattr(scoring, "remember", lambda *a: (computed.append(1), real(*a)))
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(8))
    grid = [(build_preset("h2o"), b) for b in (12, 20, 30)] + [(H2O(chunk_size=7), 20)]
    shared = shared_generate(tiny_model, ids, grid, NEW, {2})
    layers = tiny_model.config.num_hidden_layers
    assert len(computed) == 2 * layers  # once for the three budgets, once for the other chunk size
    own = own_runs(tiny_model, ids, grid, None)
    assert [(r.tokens, r.slots) for r in shared] == [(r.tokens, r.slots) for r in own]
    assert len(computed) == 2 * layers + 4 * layers  # no memo outside a grid: every run its own


def test_settings_that_probe_alike_share_the_probe_forwards(tiny_model, monkeypatch):
    """KVzip and KVzip layer-wise at two budgets read the same reconstruction forwards: run once for the
    four settings, once more for another chunk size and once for int8 storage; each setting's run is
    still its own run's."""
    import runners.generation.shared_prefill as shared
    from methods.quant import storage_kind
    from methods.seam.uniform import SlotStore

    groups = []
    real = shared.probe_caches
    monkeypatch.setattr(shared, "probe_caches", lambda m, cs, ids: (groups.append(len(cs)), real(m, cs, ids)))
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(9))
    other = build_preset("kvzip")
    other.chunk_size = 16
    grid = [(build_preset(p), b) for p in ("kvzip", "kvzip_layerwise") for b in (12, 20)]
    grid += [(other, 20), (build_preset("kvzip"), 20), (build_preset("snapkv"), 20)]
    kinds = [SlotStore] * 5 + [storage_kind("int8", {}), SlotStore]
    results = shared.shared_generate(tiny_model, ids, grid, NEW, {2}, storages=kinds)
    assert sorted(groups) == [1, 1, 4]
    for (method, budget), kind, result in zip(grid, kinds, results, strict=True):
        own = greedy_generate(tiny_model, ids, method, budget, NEW, {2}, storage=kind)
        fields = ("tokens", "slots", "kv_bytes", "prefill_head_slots")
        assert [getattr(result, f) for f in fields] == [getattr(own, f) for f in fields], method.label


def test_shared_prefill_on_sliding_layers_with_softcap():
    """Gemma-2: interleaved sliding-window layers (their own rule) and logit soft-capping."""
    model = tiny_family("gemma2")
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(6))
    grid = [
        (FullKV(), None),
        (build_preset("snapkv"), 12),
        (build_preset("h2o"), 12),
        (build_preset("kvzip"), 12),
    ]
    shared = shared_generate(model, ids, grid, NEW, {2}, question_start=PROMPT - QUESTION)
    own = own_runs(model, ids, grid, PROMPT - QUESTION)
    assert [(r.tokens, r.slots) for r in shared] == [(r.tokens, r.slots) for r in own]


def read_runs(results: Path) -> dict[str, tuple[dict, list[dict]]]:
    """Run id -> (record, prediction lines) of a result store."""
    out = {}
    for path in (results / "runs").glob("*/record.json"):
        lines = (path.parent / "predictions.jsonl").read_text().splitlines()
        out[path.parent.name] = (json.loads(path.read_text()), [json.loads(x) for x in lines])
    return out


@pytest.mark.integration
def test_grid_records_are_the_single_runs_records(run_py, data_dir, tmp_path):
    """``runner=quality_grid`` on RULER (query-agnostic), its settings' decode steps batched, stores
    each setting under the id of its own run, with its predictions; FullKV runs once."""
    common = ("task=ruler", "task.tasks=[niah_single_1]", "task.lengths=[1024]", "task.limit=2")
    grid = run_py("runner=quality_grid", *common, "runner.methods=[fullkv,snapkv]", "runner.batch_size=3",
                  "runner.compression_ratios=[0.5,0.75]", data_dir=str(data_dir))  # fmt: skip
    assert grid.returncode == 0, grid.stderr
    runs = read_runs(tmp_path / "results")
    assert sorted((r["method"], r["config"]["budget"]) for r, _ in runs.values()) == [
        ("fullkv", None), ("snapkv", 0.25), ("snapkv", 0.5)
    ]  # fmt: skip
    assert all(r["efficiency"]["prefill_shared_by"] == r["grid"]["batch_size"] == 3 for r, _ in runs.values())
    assert all(r["protocol"]["query_aware"] is False for r, _ in runs.values())
    single = run_py("method=snapkv", "compression_ratio=0.75", *common,
                    f"paths.results_dir={tmp_path / 'single'}", data_dir=str(data_dir))  # fmt: skip
    assert single.returncode == 0, single.stderr
    ((rid, (_, lines)),) = read_runs(tmp_path / "single").items()
    keys = ("prediction", "budget_slots", "kv_bytes_end", "question_start", "prompt_tokens")
    assert [[p[k] for k in keys] for p in lines] == [[p[k] for k in keys] for p in runs[rid][1]]
    assert lines[0]["question_start"] < lines[0]["prompt_tokens"]


@pytest.mark.parametrize("preset", ["h2o", "adakv_snapkv", "zsmerge", "keepkv", "less"])
def test_a_cache_is_freed_without_the_cycle_collector(tiny_model, preset):
    """A run's cache holds no reference cycle: its buffers are released when the run goes, not
    whenever Python's cycle collector runs (a grid creates caches of every setting per sample)."""
    prompt = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    gc.collect()
    gc.disable()
    try:
        run = ModelRun(tiny_model, build_preset(preset), 20, PROMPT + 2)
        with torch.inference_mode():
            run.prefill(prompt[:, :-QUESTION])
            run.append(prompt[:, -QUESTION:])
        refs = [weakref.ref(run.cache), *(weakref.ref(layer) for layer in run.cache.layers)]
        del run
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
