"""A run split over shards whose shards have not all finished (``runners.results.sharded.incomplete``) is in
no report's figures or tables, and every report names it with its missing shards, as it names runs on
other inputs: ``ruler``, ``summary``, ``budget``, ``pareto``, ``niah``, ``memory``, the experiment
tables, ``reports.compare`` and ``reports.efficiency``."""

from __future__ import annotations

import pytest

from reports import budget_figure, memory, niah, pareto
from reports.__main__ import main as reports_main
from reports.compare import main as compare_main
from reports.efficiency import main as efficiency_main
from reports.experiment import build
from reports.runs import Filters
from runners.results.sharded import ShardedStore, whole_run_id, with_shard
from runners.results.store import ResultStore
from tests.experiment_fixtures import fill
from tests.report_fixtures import config, efficiency_runs, niah_runs, quality_runs, write_run
from tests.ruler_fixtures import ruler_config, ruler_runs

LEFT_OUT = "left out, incomplete"


def shard(store: ResultStore, cfg: dict, method: str, task: str, index: int, count: int, **fields) -> str:
    """Write shard ``index`` of ``count`` of the run of ``cfg`` (finished); returns the whole run's id."""
    cfg = with_shard(cfg, count, index)
    write_run(store, cfg, method, task, "2026-11-23T10:00:00+00:00", **fields)
    return whole_run_id(cfg, None)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """Every report's runs, and one run of each kind of which a shard is missing: TOVA on RULER (shard
    0 of 2), SnapKV on XSum (shards 0 and 2 of 4), ZSMerge on a needle grid (1 of 2) and an
    efficiency run (0 of 2)."""
    root = tmp_path_factory.mktemp("incomplete")
    plain = ResultStore(root)
    quality_runs(plain)
    niah_runs(plain)
    efficiency_runs(plain)
    ruler_runs(plain)
    line = {"id": "vt-len4096-0", "prediction": "x", "metrics": {"score": 100.0, "task": "vt"}}
    ids = {
        "ruler": shard(plain, ruler_config("tova", 0.5, 2, 4096), "tova", "ruler", 0, 2, predictions=[line])
    }
    xsum = {"_target_": "tasks.xsum.XSum", "limit": 12, "max_new_tokens": 64}
    for i in (0, 2):
        ids["xsum"] = shard(plain, config("snapkv", 0.3, xsum, {"name": "quality"}), "snapkv", "xsum", i, 4)
    task = next(r for r in plain.records() if r["task"] == "infinitebench")["config"]["task"]
    ids["niah"] = shard(
        plain, config("zsmerge", 0.3, task, {"name": "quality"}), "zsmerge", "infinitebench", 1, 2
    )
    runner = {"name": "efficiency", "prompt_len": 128, "gen_len": 256, "batch_size": 1}
    ids["efficiency"] = shard(plain, config("h2o", 64, None, runner), "h2o", "synthetic", 0, 2)
    return {"root": root, "store": ShardedStore(root), "ids": ids}


def named(text: str, store: dict, kind: str, missing: str = "1") -> bool:
    """Whether ``text`` names the incomplete run of ``kind`` and its missing shards."""
    return any(
        LEFT_OUT in line and store["ids"][kind] in line and f"shard(s) {missing} missing" in line
        for line in text.splitlines()
    )


def test_ruler_names_the_incomplete_run(store, tmp_path, capsys):
    assert reports_main(["ruler", "--results-dir", str(store["root"]), "--out", str(tmp_path)]) == 0
    assert named(capsys.readouterr().err, store, "ruler")
    assert named((tmp_path / "ruler.md").read_text(), store, "ruler")


def test_summary_names_every_incomplete_quality_run(store, tmp_path, capsys):
    assert reports_main(["summary", "--results-dir", str(store["root"]), "--out", str(tmp_path)]) == 0
    err, text = capsys.readouterr().err, (tmp_path / "summary.md").read_text()
    assert all(named(t, store, "ruler") and named(t, store, "xsum", "1, 3") for t in (err, text))
    assert not named(err, store, "efficiency")  # not a quality run: summary never shows it


@pytest.mark.parametrize("report", [budget_figure, pareto])
def test_budget_and_pareto_name_the_incomplete_run(store, report):
    (plot,) = report.build(store["store"], Filters(task="xsum"))
    assert named("\n".join(plot.notes), store, "xsum", "1, 3") and not named(
        "\n".join(plot.notes), store, "ruler"
    )
    caption = " ".join(" ".join(t.get_text() for t in plot.fig.texts).split())
    assert f"Left out, incomplete: SnapKV (run {store['ids']['xsum']}): sharded run of 4 shards" in caption


def test_niah_names_the_incomplete_needle_grid(store):
    (plot,) = niah.build(store["store"], Filters())
    text = "\n".join(plot.notes)
    assert named(text, store, "niah", "0") and not named(text, store, "xsum", "1, 3")


def test_memory_and_efficiency_name_the_incomplete_efficiency_run(store, capsys):
    (plot,) = memory.build(store["store"], Filters())
    assert named("\n".join(plot.notes), store, "efficiency")
    assert efficiency_main([str(store["root"])]) == 0
    assert named(capsys.readouterr().err, store, "efficiency")


def test_compare_names_the_incomplete_run(store, capsys):
    assert compare_main([str(store["root"]), "--task", "xsum"]) == 0
    out = capsys.readouterr().out
    assert named(out, store, "xsum", "1, 3") and not named(out, store, "ruler")


def test_a_report_with_nothing_finished_names_the_incomplete_run_in_its_error(tmp_path, capsys):
    """The issue's store: shard 0 of 2 of a TOVA RULER run, nothing else."""
    plain = ResultStore(tmp_path / "results")
    line = {"id": "vt-len4096-0", "prediction": "x", "metrics": {"score": 100.0, "task": "vt"}}
    rid = shard(plain, ruler_config("tova", 0.5, 2, 4096), "tova", "ruler", 0, 2, predictions=[line])
    for command in ("ruler", "summary"):
        assert reports_main([command, "--results-dir", str(plain.root), "--out", str(tmp_path / "out")]) == 2
        (err,) = capsys.readouterr().err.splitlines()
        assert err.startswith("error:") and rid in err and "shard(s) 1 missing" in err


def test_experiment_report_names_the_incomplete_job(tmp_path):
    """A job of ZSMerge Table 2 of which shard 1 of 2 finished: listed as not done, and named."""
    plain = ResultStore(tmp_path / "results")
    job = next(
        r for r in fill(ResultStore(tmp_path / "all"), "zsmerge_table2").values() if r["method"] == "zsmerge"
    )
    fill(plain, "zsmerge_table2", skip=(job["run_id"],))
    cfg = with_shard(job["config"], 2, 1)
    write_run(plain, cfg, "zsmerge", job["task"], "2026-11-23T10:00:00+00:00", metrics=job["metrics"])
    report = build("zsmerge_table2", "smoke", plain.root, tmp_path / "out")
    missing = report.markdown.split("## Missing or failed runs")[1].split("##")[0]
    assert "incomplete" in missing and job["run_id"] in missing
    assert any(LEFT_OUT in n and job["run_id"] in n and "shard(s) 0 missing" in n for n in report.notes)
