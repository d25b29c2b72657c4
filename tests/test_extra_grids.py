"""``runner.extra_grids``: more products of settings in the same grid, with overrides of their own,
one prefill per sample for all (``runners.sweeps.grid_settings``). Each setting is its own run: the run id and
the predictions of ``run.py`` with the same overrides."""

from __future__ import annotations

import pytest

from runners.results.store import ResultStore
from runners.sweeps.grid_settings import setting_configs
from tasks.errors import KVBenchError
from tests.store_runs import ROWS, composed, lines, run, tiny_quality

EXTRA = (
    '{methods:[tova,h2o],budgets:[0.5],overrides:["decode_budget=false"]}',
    '{methods:[snapkv],budgets:[0.5],overrides:["method.window_size=4"]}',
    "{methods:[tova],budgets:[0.5]}",  # the main grid's setting again: one run
)


def test_extra_grids_give_each_settings_own_run(tmp_path, monkeypatch, tokenizer):
    """TOVA and H2O under the prompt-only rule, SnapKV with its own window and TOVA under its paper rule
    (XSum's default), twice, in one grid: four runs, each equal to its single run; the two TOVA rules are
    two runs."""
    setting = tiny_quality(tmp_path / "m", tokenizer, ROWS, max_new_tokens=6)
    grid = ("runner=quality_grid", "runner.methods=[tova]", "runner.budgets=[0.5]", "runner.batch_size=3")
    run(
        tmp_path / "grid", *grid, f"runner.extra_grids=[{','.join(EXTRA)}]", *setting, monkeypatch=monkeypatch
    )
    store = ResultStore(tmp_path / "grid" / "results")
    records = {r["run_id"]: r for r in store.records()}
    assert len(records) == 4 and all(r["status"] == "ok" for r in records.values())
    assert all(r["grid"]["settings"] == r["efficiency"]["prefill_shared_by"] == 4 for r in records.values())
    singles = (
        ("method=tova",),
        ("method=tova", "decode_budget=false"),
        ("method=h2o", "decode_budget=false"),
        ("method=snapkv", "method.window_size=4"),
    )
    for i, single in enumerate(singles):
        run(tmp_path / f"single{i}", *single, "budget=0.5", *setting, monkeypatch=monkeypatch)
        (own,) = ResultStore(tmp_path / f"single{i}" / "results").records()
        assert own["run_id"] in records, single
        assert lines(ResultStore(tmp_path / f"single{i}" / "results"), own["run_id"]) == lines(
            store, own["run_id"]
        )
        rule = records[own["run_id"]]["protocol"]["decoding"]
        if single[0] != "method=snapkv":
            assert rule == ("decode-time" if len(single) == 1 else "prompt-only"), (single, rule)
        else:
            assert records[own["run_id"]]["config"]["method"]["window_size"] == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[{methods:[tova],budgets:[0.5],overrides:["task.limit=2"]}]', "'task.limit=2' is refused"),
        ('[{methods:[tova],budgets:[0.5],overrides:["method=snapkv"]}]', "'method=snapkv' is refused"),
        ('[{methods:[tova],budgets:[0.5],overrides:["quant=int8"]}]', "'quant=int8' is refused"),
        (
            '[{methods:[tova],budgets:[0.5],overrides:["method.nosuch=1"]}]',
            "extra_grids[0].methods: tova with",
        ),
        ("[{methods:[tova],budgets:[0.5],seed:3}]", "takes the keys"),
        ("[{methods:[tova]}]", "one of runner.extra_grids[0].compression_ratios"),
        ("[{methods:[],budgets:[0.5]}]", "runner.extra_grids[0].methods must be a non-empty list"),
        ('[{methods:[tova],budgets:[0.5],quants:["int8"]}]', "takes runner.batch_size=1 (got 2)"),
    ],
)
def test_a_malformed_extra_grid_is_refused(tmp_path, monkeypatch, extra, message):
    grid = ("runner=quality_grid", "runner.methods=[snapkv]", "runner.budgets=[0.5]", "runner.batch_size=2")
    cfg = composed(tmp_path, *grid, f"runner.extra_grids={extra}", monkeypatch=monkeypatch)
    with pytest.raises(
        KVBenchError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        setting_configs(cfg)
