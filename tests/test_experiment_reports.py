"""Experiment reports and the summary render from small fixture stores; cells are record means."""

from __future__ import annotations

import math

import pytest

from reports.experiment import build
from reports.frame import label
from reports.summary import interval, ranking, scored_runs
from runners.results.store import ResultStore
from runners.results.sweep_jobs import experiment_names
from runners.sweeps.experiment_jobs import sweep_jobs
from tests.experiment_fixtures import fake_value, fill, write_quality


@pytest.mark.parametrize("experiment", experiment_names())
def test_every_experiment_report_renders_from_a_fixture_store(tmp_path, experiment):
    store = ResultStore(tmp_path / "results")
    written = fill(store, experiment)
    report = build(experiment, "smoke", store.root, tmp_path / "out")
    names = {p.name for p in report.files}
    assert {f"{experiment}_smoke.md", f"{experiment}_smoke.tex"} <= names
    base, _ = sweep_jobs(experiment, "smoke")
    if base.report.get("figure") or base.report.kind != "table":
        assert {f"{experiment}_smoke.png", f"{experiment}_smoke.pdf"} <= names
        assert all((tmp_path / "out" / n).stat().st_size > 1000 for n in names if n[-3:] in ("png", "pdf"))
    assert f"{len(written)} of {len(written)} distinct runs finished" in report.markdown
    assert "## Missing or failed runs\n\nnone" in report.markdown
    assert len(report.table) > 0


def test_a_table_cell_is_the_mean_of_its_records(tmp_path):
    """Two seeds per setting: each cell of ZSMerge Table 2 averages the two runs."""
    store = ResultStore(tmp_path / "results")
    written = fill(store, "zsmerge_table2", overrides=["seed=0,1"])
    _, jobs = sweep_jobs("zsmerge_table2", "smoke", ["seed=0,1"])
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out", ["seed=0,1"])
    table = report.table.set_index("method")
    for method, budget in [("h2o", 0.1), ("zsmerge_xsum_paper", 0.05), ("less", 0.2)]:
        runs = {j.run_id for j in jobs if j.choice("method") == method and j.cfg.budget == budget}
        assert len(runs) == 2
        expected = sum(written[r]["metrics"]["rougeL"] for r in runs) / 2
        assert table.loc[method, f"rougeL @ {label(budget)}"] == pytest.approx(expected)
    fullkv = {j.run_id for j in jobs if j.choice("method") == "fullkv"}
    assert len(fullkv) == 2  # FullKV ignores the budget: one run per seed, one reference row
    expected = sum(written[r]["metrics"]["rouge1"] for r in fullkv) / 2
    assert report.table.iloc[0]["method"] == "fullkv"  # the reference row comes first
    for budget in ("0.2", "0.1", "0.05"):  # ... repeated under every budget group, no "@ none" group
        assert table.loc["fullkv", f"rouge1 @ {budget}"] == pytest.approx(expected)
    assert not any(c.endswith("@ none") for c in report.table.columns)


def test_missing_and_failed_runs_are_listed_not_dropped(tmp_path):
    store = ResultStore(tmp_path / "results")
    _, jobs = sweep_jobs("zsmerge_table2", "smoke")
    missing = next(j for j in jobs if j.choice("method") == "h2o" and j.cfg.budget == 0.05)
    failed = next(j for j in jobs if j.choice("method") == "less" and j.cfg.budget == 0.1)
    fill(store, "zsmerge_table2", skip={missing.run_id, failed.run_id})
    record = {"run_id": failed.run_id, "config": failed.config, "method": "less", "task": "xsum"}
    store.write(record | {"status": "error", "error": "KVBenchError: no LESS kernel set"}, [])
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out")
    assert "8 of 10 distinct runs finished" in report.markdown
    assert f"| missing  | {' '.join(missing.overrides)}" in report.markdown
    assert "no LESS kernel set" in report.markdown and failed.run_id in report.markdown
    table = report.table.set_index("method")
    assert (
        table.loc["h2o", "rouge1 @ 0.05"] is None
        or table.loc["h2o", "rouge1 @ 0.05"] != table.loc["h2o", "rouge1 @ 0.05"]
    )


def test_paper_numbers_sit_next_to_ours_only_for_the_same_model(tmp_path):
    store = ResultStore(tmp_path / "results")
    fill(store, "zsmerge_table2", scale="paper")
    report = build("zsmerge_table2", "paper", store.root, tmp_path / "out")
    table = report.table.set_index(["model", "method"])
    cols = list(report.table.columns)
    assert cols.index("paper: rouge1 @ 0.2") == cols.index("rouge1 @ 0.2") + 1
    assert table.loc[("llama2-7b", "h2o"), "paper: rouge1 @ 0.2"] == pytest.approx(30.83)
    assert table.loc[("falcon-7b", "zsmerge_xsum_paper"), "paper: rougeL @ 0.05"] == pytest.approx(12.73)
    smoke = ResultStore(tmp_path / "smoke")
    fill(smoke, "zsmerge_table2")
    small = build("zsmerge_table2", "smoke", smoke.root, tmp_path / "out")
    assert not any(c.startswith("paper:") for c in small.table.columns)  # other model: no adjacent column
    assert "The paper's numbers (ZSMerge Table 2" in small.markdown and "30.83" in small.markdown


def test_summary_ranks_methods_per_budget_with_bootstrap_intervals(tmp_path):
    store = ResultStore(tmp_path)
    write_quality(store, "a", "fullkv", None, [30.0, 32.0, 34.0, 36.0, 33.0])
    write_quality(store, "b", "h2o", 0.2, [10.0, 20.0, 30.0, 40.0, 25.0])
    write_quality(store, "c", "zsmerge", 0.2, [30.0, 30.0, 31.0, 29.0, 30.0])
    write_quality(store, "d", "zsmerge", 0.2, [5.0, 6.0], task="cnndm")
    write_quality(store, "e", "h2o", 0.2, [7.0, 8.0], task="cnndm")
    runs, _ = scored_runs(store, n_resamples=200)
    h2o = runs[(runs["method"] == "H2O") & (runs["task"] == "xsum")].iloc[0]
    assert h2o["mean"] == pytest.approx(25.0) and h2o["n"] == 5
    assert 10.0 <= h2o["low"] < 25.0 < h2o["high"] <= 40.0
    table = ranking(runs)["0.2"].set_index("method")
    assert table.loc["FullKV (reference)", "mean_rank"] == 1.0  # reference, ranked within xsum
    assert table.loc["ZSMerge", "mean_rank"] == pytest.approx((2 + 2) / 2)  # 2nd on xsum, 2nd on cnndm
    assert table.loc["H2O", "mean_rank"] == pytest.approx((3 + 1) / 2)
    assert table.index[0] == "FullKV (reference)"


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_samples():
    narrow = interval([10.0, 11.0] * 200, n_resamples=500)
    wide = interval([10.0, 11.0] * 5, n_resamples=500)
    assert narrow[0] < 10.5 < narrow[1] and wide[0] < 10.5 < wide[1]
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert all(math.isnan(b) for b in interval([3.0], 100))  # no interval from one sample


def test_per_dataset_table_has_the_subsets_the_runs_scored(tmp_path):
    """ZSMerge Table 5: one column per LongBench subset named in the records' protocol."""
    store = ResultStore(tmp_path / "results")
    written = fill(store, "zsmerge_table3")
    for rid, record in written.items():
        record["protocol"] = {"subsets": ["narrativeqa", "qasper"]}
        record["metrics"] |= {"narrativeqa": fake_value(rid, "n"), "qasper": fake_value(rid, "q")}
        record["efficiency"] |= {"merges_total": 7.0}  # a counter is not a subset
        store.write(record, [])
    report = build("zsmerge_table3", "smoke", store.root, tmp_path / "out")
    per = report.markdown.split("## Per dataset")[1].split("##")[0]
    assert "narrativeqa @ 512" in per and "qasper @ 1024" in per and "merges_total" not in per


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def test_table2_figure_draws_rouge_1_2_l_and_shows_a_failed_method(tmp_path):
    from tests.report_fixtures import check_latex

    store = ResultStore(tmp_path / "results")
    _, jobs = sweep_jobs("zsmerge_table2", "smoke")
    less = {j.run_id for j in jobs if j.choice("method") == "less"}
    fill(store, "zsmerge_table2", skip=less)
    for job in jobs:
        if job.run_id in less:
            store.write({"run_id": job.run_id, "config": job.config, "method": "less", "task": "xsum",
                         "status": "error", "error": "KVBenchError: no LESS kernel set"}, [])  # fmt: skip
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out")
    (plot,) = report.plots
    axes = plot.fig.axes
    assert [ax.get_ylabel() for ax in axes] == [f"ROUGE-{k} F1 (x100)" for k in ("1", "2", "L")]
    assert all(ax.get_xlabel() == "KV budget (% of each prompt)" for ax in axes)
    texts = _legend_texts(plot.fig)
    assert "LESS: failed (3 of 3 runs)" in texts and any(t.startswith("FullKV (reference") for t in texts)
    assert any(t.startswith("ZSMerge (xsum_paper)") for t in texts)
    assert plot.fig.axes[-1].get_legend().get_title().get_text() == "method (preset)"
    tex = (tmp_path / "out" / "zsmerge_table2_smoke.tex").read_text()
    check_latex(
        tex.split("\n\n")[0] if "\n\n" in tex else tex.split("\\end{table*}")[0] + "\\end{table*}", 1 + 9
    )


def test_fig4_log_axis_legend_names_and_paper_markers_only_for_the_paper_model(tmp_path):
    store = ResultStore(tmp_path / "results")
    fill(store, "zsmerge_fig4", scale="paper")
    (plot,) = build("zsmerge_fig4", "paper", store.root, tmp_path / "out").plots
    (ax,) = plot.fig.axes
    assert ax.get_yscale() == "log" and ax.get_ylabel().startswith("attention-output error")
    texts = _legend_texts(plot.fig)
    assert ax.get_legend().get_title().get_text() == "ZSMerge compression"
    assert {"residual merging (B_r = 2%) (paper)", "eviction (no residual slots) (paper)"} <= set(texts)
    marker = next(
        line for line in ax.get_lines() if line.get_label() == "eviction (no residual slots) (paper)"
    )
    assert list(marker.get_xdata()) == [0.5] and list(marker.get_ydata()) == [pytest.approx(2.5e-3)]
    smoke = ResultStore(tmp_path / "smoke")
    fill(smoke, "zsmerge_fig4")
    (small,) = build("zsmerge_fig4", "smoke", smoke.root, tmp_path / "out").plots
    assert not any("(paper)" in t for t in _legend_texts(small.fig))


def test_fig5_marks_the_anchor_and_prints_window_sizes_as_integers(tmp_path):
    store = ResultStore(tmp_path / "results")
    fill(store, "zsmerge_fig5")
    (plot,) = build("zsmerge_fig5", "smoke", store.root, tmp_path / "out").plots
    window = next(ax for ax in plot.fig.axes if ax.get_xlabel() == "window size")
    assert [t.get_text() for t in window.get_xticklabels()] == ["1", "4", "8", "16", "64"]
    anchor = [line for line in window.get_lines() if line.get_linestyle() == ":"]
    assert anchor and anchor[0].get_xdata()[0] == 8


def test_fig3_draws_the_kv_bytes_curve(tmp_path):
    store = ResultStore(tmp_path / "results")
    written = fill(store, "zsmerge_fig3")
    for record in written.values():
        for point in record["curve"]:
            point["kv_bytes"] = point["context"] * 1024 if record["method"] == "fullkv" else 512 * 1024
        store.write(record, [])
    (plot,) = build("zsmerge_fig3", "smoke", store.root, tmp_path / "out").plots
    kv = plot.fig.axes[0]
    assert kv.get_ylabel() == "KV cache held (MiB)"
    lines = {line.get_label(): line.get_ydata() for line in kv.get_lines()}
    assert list(lines["FullKV"]) == [600 / 1024, 700 / 1024] and len(set(lines["ZSMerge @ 512 slots"])) == 1


def test_a_report_with_no_matching_runs_names_the_overrides_that_would_match(tmp_path):
    store = ResultStore(tmp_path / "results")
    fill(store, "zsmerge_table2", overrides=["task.limit=3"])
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out")
    assert "0 of 10 distinct runs finished" in report.markdown
    assert "python -m reports zsmerge_table2 --scale smoke task.limit=3" in report.markdown


@pytest.mark.parametrize("experiment", ["zsmerge_table2", "kvmerger_table1", "zsmerge_fig4"])
def test_report_jobs_name_the_run_ids_the_runners_would_store(tmp_path, experiment):
    """Without torch the reports guess which methods ignore the budget; on an empty store every
    job's id must be the one the sweep (built methods) gives."""
    from reports.frame import report_jobs

    _, jobs = sweep_jobs(experiment, "smoke")
    _, light, _ = report_jobs(experiment, "smoke", [], ResultStore(tmp_path))
    assert [j.run_id for j in light] == [j.run_id for j in jobs]
