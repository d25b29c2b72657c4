"""The sweep summary line, from a fabricated sweep directory and store (no model, no Hydra app;
end to end with the basic and submitit launchers: tests/test_sweeps.py)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runners.output.record import run_config
from runners.results.store import ResultStore, run_id
from runners.sweeps.summary import JOB_RUNS, SweepSummary, summary_line, sweep_counts
from tests.conftest import REPO


def fabricate(tmp_path, jobs: list[list[str]]) -> list[str]:
    """Save each job's composed config as Hydra does (``<sweep>/<n>/.hydra/config.yaml``,
    interpolations unresolved); returns their run ids."""
    ids = []
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for n, overrides in enumerate(jobs):
            cfg = compose(config_name="config", overrides=overrides)
            (tmp_path / "sweep" / str(n) / ".hydra").mkdir(parents=True)
            OmegaConf.save(cfg, tmp_path / "sweep" / str(n) / ".hydra" / "config.yaml")
            ids.append(run_id(run_config(cfg, instantiate(cfg.method).traits.budget_applies)))
    return ids


def test_jobs_are_counted_from_their_saved_configs_and_the_store(tmp_path, capsys):
    jobs = [["method=h2o", f"budget={b}"] for b in (0.1, 0.2, 0.3, 0.4)] + [["method=fullkv", "budget=0.5"]]
    ids = fabricate(tmp_path, jobs)
    store = ResultStore(tmp_path / "results")
    here, other = {"dir": str(tmp_path / "sweep")}, {"dir": str(tmp_path / "earlier")}
    store.write({"run_id": ids[0], "status": "ok", "sweep": here}, [])
    store.write({"run_id": ids[1], "status": "ok", "sweep": other}, [])  # finished before: skipped
    store.write({"run_id": ids[2], "status": "oom", "sweep": here}, [])
    # ids[3]: no record (a killed job); FullKV ignores the budget: its id has budget null
    store.write({"run_id": ids[4], "status": "ok", "sweep": None}, [])  # a single run: skipped
    counts = sweep_counts(tmp_path / "sweep", tmp_path / "results")
    assert (counts["ok"], counts["failed"], counts["skipped"], counts["no_record"]) == (1, 2, 2, 1)
    line = summary_line("s", counts)
    assert line == "sweep s: 1 ok / 2 failed / 2 skipped (1 failed without a record: killed?)"

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}},
                               "paths": {"results_dir": str(tmp_path / "results")}})  # fmt: skip
    SweepSummary().on_multirun_end(config)
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith("1 ok / 2 failed / 2 skipped (1 failed without a record: killed?)")
    )


def test_a_job_whose_config_names_none_of_its_runs_is_counted_by_the_records_it_wrote(tmp_path):
    """A grid job's runs are its settings' (its saved config is the grid's): two shards of a grid."""
    grid = ["runner=quality_grid", "runner.budgets=[0.5]", "runner.num_shards=2"]
    fabricate(tmp_path, [[*grid, f"runner.shard_index={i}"] for i in (0, 1)])
    store = ResultStore(tmp_path / "results")
    for job, statuses in enumerate((("ok", "ok"), ("ok", "error"))):
        for n, status in enumerate(statuses):
            sweep = {"dir": str(tmp_path / "sweep"), "job_num": job}
            store.write({"run_id": f"{job}{n}", "status": status, "sweep": sweep}, [])
    counts = sweep_counts(tmp_path / "sweep", tmp_path / "results")
    assert (counts["ok"], counts["failed"], counts["no_record"]) == (1, 1, 0)


def test_a_summary_that_cannot_be_made_is_a_warning(tmp_path, capsys):
    (tmp_path / "sweep" / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "sweep" / "0" / ".hydra" / "config.yaml").write_text("method: [unclosed\n")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}},
                               "paths": {"results_dir": str(tmp_path / "results")}})  # fmt: skip
    SweepSummary().on_multirun_end(config)
    out, err = capsys.readouterr()
    assert out.strip().endswith("0 ok / 1 failed / 0 skipped") and "not read" in err


def test_a_grid_job_whose_settings_had_all_finished_is_skipped(tmp_path):
    """A grid job run again writes no record; the runs it lists in its job directory say it reused
    them (a listed run that is missing or failed leaves it failed)."""
    fabricate(tmp_path, [["runner=quality_grid", "runner.budgets=[0.5]"]] * 2)
    store = ResultStore(tmp_path / "results")
    earlier = {"dir": str(tmp_path / "earlier"), "job_num": 0}
    store.write({"run_id": "a", "status": "ok", "sweep": earlier}, [])
    store.write({"run_id": "b", "status": "error", "sweep": None}, [])
    (tmp_path / "sweep" / "0" / JOB_RUNS).write_text('["a"]')
    (tmp_path / "sweep" / "1" / JOB_RUNS).write_text('["a", "b"]')
    counts = sweep_counts(tmp_path / "sweep", tmp_path / "results")
    assert (counts["ok"], counts["failed"], counts["skipped"], counts["no_record"]) == (0, 1, 1, 1)
