"""One setting run on two versions of its data (another inputs hash, another run id) is one run in
every report: the newest finished, its n the samples it scored, never the two pooled; the other runs
of the setting are named ("also run on other inputs"). Runs of several seeds count each sample once."""

from __future__ import annotations

import json

import pytest

from reports import budget_figure, memory, niah, pareto, ruler, ruler_table
from reports.__main__ import main as reports_main
from reports.compare import main as compare_main
from reports.efficiency import main as efficiency_main
from reports.experiment import build
from reports.runs import Filters
from reports.summary import render
from reports.tables import runs_table
from runners.results.store import ResultStore
from tests.experiment_fixtures import fill
from tests.pairing_fixtures import rerun_on_other_inputs
from tests.report_fixtures import (
    N_SAMPLES,
    config,
    efficiency_runs,
    niah_runs,
    quality_runs,
    write_run,
)
from tests.ruler_fixtures import ruler_runs

ALSO = "also run on other inputs"


def _of(records: list[dict], method: str, budget: float | None = None) -> dict:
    return next(r for r in records if r["method"] == method and r["config"]["budget"] == budget)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """A store whose ZSMerge XSum run at 10%, needle grid, efficiency run and one SnapKV RULER run
    were run again on changed data (scores halved), and ZSMerge at 10% once more on a third
    version that failed (the newest run, not a finished one)."""
    store = ResultStore(tmp_path_factory.mktemp("other_inputs"))
    old = {
        "xsum": _of(quality_runs(store), "zsmerge", 0.1),
        "niah": _of(niah_runs(store), "zsmerge", 0.1),
        "efficiency": _of(efficiency_runs(store), "zsmerge", 64),
        "ruler": _of(ruler_runs(store), "snapkv", 0.5),
    }
    day2, day3 = "2026-11-21T09:00:00+00:00", "2026-11-22T09:00:00+00:00"
    new = {kind: rerun_on_other_inputs(store, r, day2, "v2") for kind, r in old.items()}
    failed = rerun_on_other_inputs(store, old["xsum"], day3, "v3", status="error")
    return {"store": store, "old": old, "new": new, "failed": failed}


def _named(text: str, runs: dict, kind: str) -> bool:
    """Whether ``text`` names the shown run's other runs in the note's words."""
    others = [runs["old"][kind]["run_id"]] + ([runs["failed"]["run_id"]] if kind == "xsum" else [])
    return ALSO in text and runs["new"][kind]["run_id"] in text and all(o in text for o in others)


def _rouge1(runs: dict) -> float:
    """The newest ZSMerge run's mean ROUGE-1 over its per-sample scores."""
    path = runs["store"].run_dir(runs["new"]["xsum"]["run_id"]) / "predictions.jsonl"
    scores = [json.loads(line)["metrics"]["rouge1"] for line in path.read_text().splitlines()]
    return sum(scores) / len(scores)


def test_budget_draws_the_newest_finished_run_alone_and_names_the_others(runs):
    assert runs["old"]["xsum"]["config"] == runs["new"]["xsum"]["config"]  # one setting, two run ids
    (plot,) = budget_figure.build(runs["store"], Filters(task="xsum"))
    (point,) = plot.data[(plot.data["method"] == "zsmerge") & (plot.data["budget"] == 0.1)].itertuples()
    assert (point.n, point.runs, point.run_ids) == (N_SAMPLES, 1, runs["new"]["xsum"]["run_id"])
    assert point.mean == pytest.approx(_rouge1(runs))
    (note,) = [n for n in plot.notes if ALSO in n]
    assert _named(note, runs, "xsum") and _named(" ".join(t.get_text() for t in plot.fig.texts), runs, "xsum")


def test_pareto_draws_one_point_per_setting(runs):
    (plot,) = pareto.build(runs["store"], Filters(task="xsum"))
    zsmerge = plot.data[(plot.data["method"] == "zsmerge") & (plot.data["budget"] == 0.1)]
    assert list(zsmerge["n"]) == [N_SAMPLES] and list(zsmerge["mean"]) == [pytest.approx(_rouge1(runs))]
    assert any(_named(n, runs, "xsum") for n in plot.notes)


def test_summary_cell_is_one_run_and_the_others_are_listed(runs, tmp_path):
    text, _, warnings = render(runs["store"], tmp_path, n_resamples=50)
    row = next(line for line in text.split("## budget 0.1")[1].splitlines() if line.startswith("| ZSMerge "))
    assert f"{_rouge1(runs):.2f} [" in row and f"n={N_SAMPLES}" in row
    assert _named(text.split("## Also run on other inputs")[1], runs, "xsum")
    assert any(_named(w, runs, "xsum") for w in warnings)


def test_compare_shows_one_row_per_setting(runs, capsys):
    assert compare_main([str(runs["store"].root), "--task", "xsum"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if " zsmerge " in line and "10% of prompt" in line]
    assert len(rows) == 1 and f"{runs['new']['xsum']['metrics']['rouge1']:.2f}" in rows[0]
    assert any(_named(line, runs, "xsum") for line in out.splitlines())


def test_niah_cells_are_the_newest_run_scores(runs):
    (plot,) = niah.build(runs["store"], Filters(task="infinitebench"))
    zsmerge = plot.data[plot.data["method"] == "zsmerge"]
    assert set(zsmerge["run_id"]) == {runs["new"]["niah"]["run_id"]}
    assert set(zsmerge[zsmerge["depth"] == 0.5]["score"]) == {50.0}  # 100 halved; never pooled to 75
    assert any(_named(n, runs, "niah") for n in plot.notes)


def test_memory_draws_one_curve_per_setting(runs):
    (plot,) = memory.build(runs["store"], Filters())
    zsmerge = plot.data[plot.data["method"] == "zsmerge"]
    assert set(zsmerge["run_id"]) == {runs["new"]["efficiency"]["run_id"]} and len(zsmerge) == 4
    assert any(_named(n, runs, "efficiency") for n in plot.notes)


def test_efficiency_tables_show_one_run_per_setting(runs, capsys):
    assert efficiency_main([str(runs["store"].root)]) == 0
    captured = capsys.readouterr()
    memory_part = captured.out.split("## Memory")[1].split("##")[0]
    assert len([line for line in memory_part.splitlines() if "ZSMerge" in line]) == 1
    assert any(_named(line, runs, "efficiency") for line in captured.err.splitlines())


def test_ruler_row_is_the_newest_run(runs):
    found = ruler.rows(runs["store"], Filters())
    board = ruler.leaderboard(found.frame)
    (row,) = board[(board["method"] == "snapkv") & (board["compression_ratio"] == 0.5)].itertuples()
    assert (row.runs, row.run_ids) == (1, runs["new"]["ruler"]["run_id"])
    assert row.avg == pytest.approx(runs["new"]["ruler"]["metrics"]["avg"])
    assert _named(ruler_table.markdown(board, "ratio", found.pairing), runs, "ruler")


def test_runs_lists_both_runs_by_full_id_and_names_the_shown_one(runs, capsys):
    table = runs_table(runs["store"], Filters(task="xsum", method=["zsmerge"]))
    ids = {runs[k]["xsum"]["run_id"] for k in ("old", "new")} | {runs["failed"]["run_id"]}
    assert ids <= set(table["run"])  # three lines told apart by their run ids
    assert reports_main(["runs", "--task", "xsum", "--results-dir", str(runs["store"].root)]) == 0
    assert any(_named(line, runs, "xsum") for line in capsys.readouterr().err.splitlines())


def test_experiment_report_names_the_run_on_other_inputs(tmp_path):
    store = ResultStore(tmp_path / "results")
    written = fill(store, "zsmerge_table2")
    old = next(r for r in written.values() if r["method"] == "zsmerge")
    new = rerun_on_other_inputs(store, old, "2026-11-21T09:00:00+00:00", "v2")
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out")
    section = report.markdown.split("## Also run on other inputs")[1]
    assert new["run_id"] in section and old["run_id"] in section and ALSO in section
    assert any(old["run_id"] in n and ALSO in n for n in report.notes)


def test_seeds_of_one_setting_count_each_sample_once(tmp_path):
    store = ResultStore(tmp_path)
    task = {"_target_": "tasks.xsum.XSum", "limit": 6, "max_new_tokens": 64}
    for seed, shift in ((0, 0.0), (1, 10.0)):
        predictions = [{"id": str(i), "metrics": {"rouge1": 10.0 * i + shift}} for i in range(6)]
        cfg = config("zsmerge", 0.1, task, {"name": "quality"}) | {"seed": seed}
        write_run(
            store, cfg, "zsmerge", "xsum", f"2026-11-20T10:0{seed}:00+00:00",
            metrics={"rouge1": 25.0 + shift}, predictions=predictions,
        )  # fmt: skip
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    (point,) = plot.data.itertuples()
    assert (point.n, point.runs, point.mean) == (6, 2, pytest.approx(30.0))  # 6 samples, 2 seeds averaged
    text, _, _ = render(store, tmp_path / "out", n_resamples=50)
    assert "30.00 [" in text and "n=6" in text and "n=12" not in text
