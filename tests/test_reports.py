"""The comparison report: one row per finished run, non-default settings named, budgets ordered."""

from __future__ import annotations

from reports.compare import comparison, main, non_default_settings


def record(method: str, budget: float | None, status: str = "ok", **method_cfg) -> dict:
    return {
        "run_id": f"{method}-{budget}",
        "status": status,
        "method": method,
        "task": "xsum",
        "n_samples": 30,
        "config": {
            "model": {"name": "m"},
            "budget": budget,
            "budget_unit": "prompt",
            "method": method_cfg,
            "runner": {"name": "quality"},
        },
        "metrics": {"rouge1": 17.555, "rouge2": 2.0, "rougeL": 12.0},
        "efficiency": {"decode_tokens_per_s": 14.84, "kv_fraction_of_fullkv": 0.2, "peak_rss_bytes": 2**30},
        "wall_seconds": 100.4,
    }


def test_settings_name_only_what_differs_from_the_defaults():
    assert (
        non_default_settings("keepkv", {"_target_": "x", "merge": "convex", "threshold": 0.8})
        == "merge=convex"
    )
    assert non_default_settings("kvmerger", {"exact_budget": True}) == "exact_budget=True"


def test_comparison_rows_and_order(tmp_path, capsys):
    records = [
        record("h2o", 0.05),
        record("fullkv", None),
        record("keepkv", 0.2, merge="convex"),
        record("snapkv", 0.2, status="error"),
        record("h2o", 0.2),
    ]
    frame = comparison(records)
    assert list(frame["method"]) == ["fullkv", "h2o", "keepkv", "h2o"]  # FullKV first, then budget desc.
    assert list(frame["budget"].fillna(-1)) == [-1, 0.2, 0.2, 0.05]
    assert frame.loc[2, "settings"] == "merge=convex"
    assert abs(frame.loc[0, "rouge1"] - 17.555) <= 0.005 + 1e-9
    assert frame.loc[0, "peak RSS MiB"] == 1024 and frame.loc[0, "decode tok/s"] == 14.8
    assert comparison(records, task="longbench").empty
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: no run records under {tmp_path}/runs\n"


def test_comparison_keeps_error_runs_out_names_presets_and_prints_no_nan(tmp_path, monkeypatch, capsys):
    from reports.presets import presets
    from runners.results.store import ResultStore

    store = ResultStore(tmp_path)
    paper = record("zsmerge", 0.1, **presets()["zsmerge_xsum_paper"])
    error_runner = record("zsmerge", None) | {"run_id": "err"}
    error_runner["config"] = error_runner["config"] | {"runner": {"name": "error"}}
    no_speed = record("h2o", 0.05) | {"efficiency": {}}
    for rec in (paper, error_runner, no_speed, record("fullkv", None)):
        store.write(rec, [])
    frame = comparison(store.records())
    assert "err" not in set(frame.get("run_id", [])) and len(frame) == 3  # the error runner is no quality run
    assert list(frame["preset"]) == ["fullkv", "zsmerge_xsum_paper", "h2o"]
    assert list(frame["budget unit"]) == ["", "prompt", "prompt"]
    monkeypatch.setenv("KVBENCH_RESULTS_DIR", str(tmp_path))
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "zsmerge_xsum_paper" in out and "10% of prompt" in out and "–" in out
    assert "nan" not in out.lower() and "<NA>" not in out


def efficiency_record(
    method: str, batch: int, status: str = "ok", tokens_per_s: float = 10.0, key: str = "batch_size"
) -> dict:
    """An efficiency record; ``key="batch"``: as stored before ``runner.batch`` became ``batch_size``."""
    eff = {
        "tokens_per_s": tokens_per_s, "latency_seconds": 20.0, "decode_tokens_per_s": 12.0,
        "kv_bytes_end": 2**20, "allocated_kv_bytes_end": 2**20 + 1024, "fullkv_bytes_end": 2**24,
        "peak_memory_bytes": 2**30,
    }  # fmt: skip
    runner = {"name": "efficiency", key: batch}
    return {
        "run_id": f"{method}-{batch}-{status}",
        "status": status,
        "method": method,
        "task": "synthetic",
        "device": {"type": "cpu", "name": "x86_64"},
        "shape": {"prompt_len": 1024, "gen_len": 1024, key: batch},
        "config": {"model": {"name": "m"}, "budget": 0.05, "method": {}, "runner": runner},
        "efficiency": eff if status == "ok" else None,
        "curve": [{"context": 1100, "tokens_per_s": 9.0, "kv_bytes": 2**20, "memory_bytes": 2**29}],
    }


def test_efficiency_report_has_table1_cells_and_oom(tmp_path, capsys):
    """Table 1 cells and OOM; a record stored before the rename (``batch``) shares its row with a
    new one (``batch_size``): the store reads it under the new names."""
    from reports.efficiency import main as efficiency_main
    from reports.efficiency import throughput_table
    from runners.results.store import ResultStore

    store = ResultStore(tmp_path)
    store.write(efficiency_record("fullkv", 8, tokens_per_s=177.8, key="batch"), [])
    store.write(efficiency_record("zsmerge", 8, tokens_per_s=161.6), [])
    store.write(efficiency_record("h2o", 16, status="oom"), [])
    error = efficiency_record("zsmerge", 1)
    error.update(
        run_id="err", task="xsum", config=error["config"] | {"runner": {"name": "error"}, "budget": None}
    )
    error["error_analysis"] = {"budgets": [0.05, 0.5], "mean": [0.4321, 0.1], "per_layer": [[0.4321], [0.1]]}
    store.write(error, [])
    assert efficiency_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "177.8 / 20.0" in out and "161.6 / 20.0" in out and "OOM" in out
    assert "1024+1024 x 8" in out and "1024+1024 x 16" in out
    assert "4.321e-01" in out and "Context growth" in out
    assert efficiency_main([str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == f"error: results dir {tmp_path / 'empty'} does not exist\n"
    old = store.read("fullkv-8-ok")
    assert old["shape"]["batch_size"] == old["config"]["runner"]["batch_size"] == 8
    table = throughput_table([r for r in store.records() if r["run_id"] != "err"])
    row = table.xs("1024+1024 x 8", level="shape")
    assert len(row) == 1 and list(row.iloc[0][["FullKV @ 5% of prompt", "ZSMerge @ 5% of prompt"]]) == [
        "177.8 / 20.0", "161.6 / 20.0"
    ]  # fmt: skip
