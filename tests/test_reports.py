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
        "config": {"model": {"name": "m"}, "budget": budget, "method": method_cfg},
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
    assert main([str(tmp_path)]) == 1 and "no finished runs" in capsys.readouterr().err
