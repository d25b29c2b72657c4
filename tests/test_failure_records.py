"""A job that fails before its run writes a record (``runners.output.record.record_failure``) is stored
under its run's setting: the id a finished run of the same config is stored under, so a sweep
counts the job as failed, not as missing."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

import runners.output.record
from runners.output.record import record_failure
from runners.results.store import ResultStore, run_config, setting_id, setting_of
from runners.sweeps.summary import job_setting_id, sweep_counts
from tests.conftest import REPO
from tests.faults import method_configs

#: Methods whose traits say the budget does not drive them (``Traits.budget_applies`` False).
BUDGET_IGNORED = [
    ["method=fullkv"],
    ["method=dms"],
    ["method=simlayerkv"],
    ["method=duo_attention", "method.pattern=tests/data/duo_pattern_2x2.tsv"],
    ["method=kvmerger"],
]


@pytest.mark.parametrize("overrides", BUDGET_IGNORED, ids=lambda o: o[0])
def test_a_failed_run_is_stored_under_its_own_setting_and_counted_failed(tmp_path, monkeypatch, overrides):
    sweep = tmp_path / "sweep"
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[*overrides, "budget=0.3", f"paths.results_dir={tmp_path / 'results'}", "logger={}"],
        )
    assert not instantiate(cfg.method).traits.budget_applies
    (sweep / "0" / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, sweep / "0" / ".hydra" / "config.yaml")
    monkeypatch.setattr(runners.output.record, "sweep_info", lambda: {"dir": str(sweep), "job_num": 0})

    rid = record_failure(cfg, RuntimeError("the model did not load"))

    assert setting_of(rid) == setting_id(run_config(cfg, budget_applies=False))
    assert setting_of(rid) == job_setting_id(sweep / "0" / ".hydra" / "config.yaml")
    assert ResultStore(tmp_path / "results").read(rid)["status"] == "error"
    counts = sweep_counts(sweep, tmp_path / "results")
    assert (counts["ok"], counts["failed"], counts["no_record"]) == (0, 1, 0)


def test_the_reports_copy_of_budget_applies_agrees_with_every_method():
    """``reports.presets.budget_ignored`` (no torch) names the setting of a run not stored yet: it
    must say what each method's ``Traits.budget_applies`` says."""
    from reports.presets import budget_ignored

    configs = method_configs()
    wrong = [c["_target_"] for c in configs if budget_ignored(c) == instantiate(c).traits.budget_applies]
    assert wrong == []
