"""The paper's numbers stored in experiment configs (``report.paper.cells``) describe runs the
paper-scale sweep makes: every cell's keys (model, method, budget, shape) match one of its jobs,
its values are numbers of the report's columns, and the paper's checkpoint and precision are the
ones the sweep loads (KVMerger's chat / v0.1 models, ZeroMerge's float32 runs)."""

from __future__ import annotations

import numbers

import pytest
from omegaconf import ListConfig, OmegaConf

from reports.cells import stand_in
from runners.results.sweep_jobs import Job, experiment_names
from runners.sweeps.experiment_jobs import sweep_jobs

GROUPS = ("method", "task", "model")


def with_cells() -> list[str]:
    names = []
    for name in experiment_names():
        spec = OmegaConf.load(f"configs/experiment/{name}.yaml")
        if OmegaConf.select(spec, "report.paper.cells"):
            names.append(name)
    return names


def job_value(job: Job, key: str) -> object:
    """A cell key's value for a job: a config group's chosen preset (the model preset's name; for
    random weights of a paper model's shape, that model: ``reports.cells.stand_in``), or a field of
    the job's stored config (``budget`` null where the method ignores it)."""
    found = stand_in(job.cfg.model.name, job.config["model"]) if key == "model" else None
    if found is not None:
        return found.paper
    if key in GROUPS:
        return job.choice(key) or (job.cfg.model.name if key == "model" else job.name(key))
    return OmegaConf.select(OmegaConf.create(job.config), key, default=None)


def job_matches(job: Job, key: str, value: object) -> bool:
    """Whether a job covers a cell's key: its value, or for ``budget`` one of the budgets a
    runner sweeps inside one job (``runner.budgets`` of the error runner)."""
    if job_value(job, key) == value:
        return True
    inner = job_value(job, "runner.budgets") if key == "budget" else None
    return bool(inner) and value in inner


@pytest.fixture(scope="module")
def paper_sweeps() -> dict[str, tuple]:
    return {name: sweep_jobs(name, "paper") for name in with_cells()}


def test_every_cell_matches_a_paper_scale_job(paper_sweeps):
    assert {"kvmerger_table1", "keepkv_table3", "zsmerge_table1"} <= set(paper_sweeps)
    for name, (base, jobs) in paper_sweeps.items():
        values = set(base.report.get("values") or [])
        y = OmegaConf.select(base.report, "figure.y", default=None)
        values |= set(y) if isinstance(y, (list, ListConfig)) else {y} if y else set()
        if base.report.get("kind") == "error":  # the error report's one value (reports/kinds.py)
            values.add("rel_error")
        cells = OmegaConf.to_container(base.report.paper.cells, resolve=True)
        for cell in cells:
            keys = {k: v for k, v in cell.items() if k not in values}
            numbers_ = {k: v for k, v in cell.items() if k in values}
            assert numbers_ and all(isinstance(v, numbers.Real) for v in numbers_.values()), (name, cell)
            # a cell names its method unless the experiment runs one method only (zsmerge_fig4)
            implied = {"method"} if len({job_value(job, "method") for job in jobs}) == 1 else set()
            assert set(keys) | implied >= {"model", "method"}, (name, cell)
            assert any(all(job_matches(job, k, v) for k, v in keys.items()) for job in jobs), (name, keys)
        identities = [tuple(sorted((k, str(v)) for k, v in c.items() if k not in values)) for c in cells]
        assert len(identities) == len(set(identities)), f"{name}: a cell is stored twice"


def test_kvmerger_numbers_sit_under_the_papers_checkpoints(paper_sweeps):
    _, jobs = paper_sweeps["kvmerger_table1"]
    assert {job.cfg.model.id for job in jobs} == {
        "meta-llama/Llama-2-7b-chat-hf",
        "mistralai/Mistral-7B-Instruct-v0.1",
    }
    _, jobs = sweep_jobs("kvmerger_table2", "paper")
    assert {job.cfg.model.id for job in jobs} == {"meta-llama/Llama-2-7b-chat-hf"}


def test_zsmerge_table1_runs_in_the_papers_float32_and_stores_its_latencies(paper_sweeps):
    base, jobs = paper_sweeps["zsmerge_table1"]
    assert {job.cfg.model.dtype for job in jobs} == {"float32"}
    # the paper's shape at full depth, random weights (timings do not depend on their values)
    assert {(job.cfg.model.loader, job.cfg.model.shape, job.cfg.model.num_layers) for job in jobs} == {
        ("random", "llama2-7b", None)
    }
    assert {(job.cfg.runner.prompt_len, job.cfg.runner.gen_len) for job in jobs} == {
        (n, n) for n in (1024, 2048, 4096)
    }
    cells = OmegaConf.to_container(base.report.paper.cells)
    assert all({"tokens_per_s", "latency_seconds"} <= set(c) for c in cells)
    shapes = {(c["runner.prompt_len"], c["runner.batch_size"]) for c in cells}
    assert shapes == {(1024, 4), (1024, 8), (2048, 8), (2048, 16), (4096, 4), (4096, 8), (4096, 16)}
    zsmerge = {(c["runner.prompt_len"], c["runner.batch_size"]): c for c in cells if c["method"] == "zsmerge"}
    assert (zsmerge[(2048, 16)]["tokens_per_s"], zsmerge[(2048, 16)]["latency_seconds"]) == (281.9, 178.4)


@pytest.mark.parametrize("name", ["keepkv_table3", "kvmerger_table1"])
def test_every_method_the_sweep_runs_has_the_papers_row(paper_sweeps, name):
    base, jobs = paper_sweeps[name]
    cells = OmegaConf.to_container(base.report.paper.cells)
    have = {(c["model"], c["method"]) for c in cells}
    assert {(job_value(job, "model"), job_value(job, "method")) for job in jobs} <= have
