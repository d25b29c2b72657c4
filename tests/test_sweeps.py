"""Hydra multirun sweeps end to end: one record per job, reruns skip finished runs, a failing job is
recorded and the sweep goes on, a killed sweep leaves readable records, Optuna and submitit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.cli_runs import TINY, multirun, records, sweep_env
from tests.conftest import REPO

pytestmark = pytest.mark.integration


def summary(result: subprocess.CompletedProcess) -> str:
    """The counts of the sweep's last line (runners/sweeps/summary.py)."""
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("sweep "), result.stdout[-2000:]
    return last.split(": ", 1)[1]


def record_mtimes(tmp_path: Path) -> dict[str, int]:
    paths = (tmp_path / "results" / "runs").glob("*/record.json")
    return {p.parent.name: p.stat().st_mtime_ns for p in paths}


def test_a_grid_writes_one_record_per_job_keeps_going_past_a_failure_and_a_rerun_skips_finished_runs(
    tmp_path, data_dir
):
    # alpha=-1 fails validation (ZSMerge Eq. 8 needs alpha in [0, 1]); its jobs are the first two.
    sweep = ("method=zsmerge", "method.alpha=-1,0.5", "budget=0.1,0.2")
    first = multirun(tmp_path, data_dir, *sweep)
    assert first.returncode == 0, first.stderr[-3000:]
    recs = records(tmp_path)
    assert {(r["config"]["method"]["alpha"], r["config"]["budget"], r["status"]) for r in recs.values()} == {
        (-1, 0.1, "error"), (-1, 0.2, "error"), (0.5, 0.1, "ok"), (0.5, 0.2, "ok")
    }  # fmt: skip
    for r in recs.values():
        assert "alpha" in r["error"] if r["status"] == "error" else r["metrics"]["rouge1"] >= 0
    sweeps = {r["sweep"]["dir"] for r in recs.values()}
    assert len(sweeps) == 1 and sorted(r["sweep"]["job_num"] for r in recs.values()) == [0, 1, 2, 3]
    assert summary(first) == "2 ok / 2 failed / 0 skipped"
    before = {rid: mtime for rid, mtime in record_mtimes(tmp_path).items() if recs[rid]["status"] == "ok"}
    # A failed run is attempted again on the next sweep; only finished runs are skipped, never rewritten.
    second = multirun(tmp_path, data_dir, *sweep)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {rid: record_mtimes(tmp_path)[rid] for rid in before} == before
    assert second.stdout.count("already finished") == 2 and "recorded as run" in second.stderr
    assert summary(second) == "0 ok / 2 failed / 2 skipped"


def test_killing_a_sweep_between_jobs_leaves_readable_records_and_it_resumes(tmp_path, data_dir):
    cmd = [sys.executable, "run.py", "-m", "method=h2o", "budget=0.1,0.2,0.3", *TINY]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=sweep_env(tmp_path, data_dir), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    runs = tmp_path / "results" / "runs"
    deadline = time.time() + 300
    while time.time() < deadline and not list(runs.glob("*/record.json")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = list(runs.glob("*/record.json"))
    assert 1 <= len(written) < 3
    for path in written:  # complete JSON: written by rename, never partially
        assert json.loads(path.read_text())["status"] == "ok"
    resumed = multirun(tmp_path, data_dir, "method=h2o", "budget=0.1,0.2,0.3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("already finished") == len(written)
    assert sorted(r["config"]["budget"] for r in records(tmp_path).values()) == [0.1, 0.2, 0.3]


def test_optuna_sweeper_maximises_the_configured_metric(tmp_path, data_dir):
    result = multirun(tmp_path, data_dir, "hparams_search=zsmerge_optuna", "hydra.sweeper.n_trials=2")
    assert result.returncode == 0, result.stderr[-3000:]
    recs = list(records(tmp_path).values())
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs)
    (results_file,) = (tmp_path / "logs").glob("multiruns/*/optimization_results.yaml")
    best = yaml.safe_load(results_file.read_text())
    assert best["best_value"] == pytest.approx(max(r["metrics"]["rougeL"] for r in recs))
    best_alpha = best["best_params"]["method.alpha"]
    assert any(r["config"]["method"]["alpha"] == pytest.approx(best_alpha) for r in recs)


def test_submitit_local_launcher_runs_the_sweep_in_worker_processes(tmp_path, data_dir):
    result = multirun(tmp_path, data_dir, "hydra/launcher=submitit_local", "method=h2o,zsmerge")
    assert result.returncode == 0, result.stderr[-3000:]
    recs = records(tmp_path)
    assert {r["method"] for r in recs.values()} == {"h2o", "zsmerge"}
    assert all(r["status"] == "ok" for r in recs.values())
    assert list((tmp_path / "logs").glob("multiruns/*/.submitit/*/*_result.pkl"))
    assert {r["sweep"]["job_num"] for r in recs.values()} == {0, 1}
    assert summary(result) == "2 ok / 0 failed / 0 skipped"  # counted from the store, not in-process


def test_a_sweep_with_an_unknown_option_stops_before_any_job(tmp_path, data_dir):
    result = multirun(tmp_path, data_dir, "method=h2o,nope")
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        result.stderr.strip().splitlines()[-1]
    ]
    assert "nope" in result.stderr and not (tmp_path / "results" / "runs").exists()


def test_wandb_runs_are_grouped_by_sweep():
    from runners.output.wandb_logger import sweep_group

    record = {
        "sweep": {"dir": "logs/multiruns/2026-11-23_01-00-00", "job_num": 3, "experiment": "zsmerge_fig5"}
    }
    assert sweep_group(record) == "zsmerge_fig5/2026-11-23_01-00-00"
    assert sweep_group({"sweep": {"dir": "x/2026", "experiment": None}}) == "sweep/2026"
    assert sweep_group({"sweep": None}) is None
