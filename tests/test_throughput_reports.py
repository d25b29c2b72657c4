"""The papers' throughput tables (ZSMerge Table 1, KeepKV Table 1 and its largest-batch variant) render
from fixture stores: each cell's tokens/s over our FullKV's at its shape, beside the paper's ratio."""

from __future__ import annotations

import pytest

from reports.experiment import build
from runners.results.store import ResultStore
from runners.sweeps.experiment_jobs import sweep_jobs
from tests.experiment_fixtures import fill


def _tokens(written: dict, jobs, method: str, **keys) -> float:
    """The fixture's tokens/s of the one run of ``method`` whose runner has ``keys``."""
    (rid,) = {
        j.run_id
        for j in jobs
        if j.choice("method") == method and all(j.cfg.runner[k] == v for k, v in keys.items())
    }
    return written[rid]["metrics"]["tokens_per_s"]


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_zsmerge_table1_sets_each_ratio_to_our_fullkv_beside_the_papers(tmp_path, scale):
    """Random Llama-2-7B weights (2 layers at cpu, 32 at paper) stand in for the paper's Llama-2-7B:
    each cell's tokens/s over our FullKV's at the same shape, beside the paper's ratio."""
    store = ResultStore(tmp_path / "results")
    written = fill(store, "zsmerge_table1", scale=scale)
    _, jobs = sweep_jobs("zsmerge_table1", scale)
    report = build("zsmerge_table1", scale, store.root, tmp_path / "out")
    (part,) = [
        t for heading, t in report.parts.items() if heading.startswith("tokens_per_s over the reference")
    ]
    part = part.set_index(["runner.prompt_len", "runner.batch_size", "method"])
    for method in ("fullkv", "h2o", "less_random", "zsmerge"):
        mine = _tokens(written, jobs, method, prompt_len=2048, batch_size=8)
        fullkv = _tokens(written, jobs, "fullkv", prompt_len=2048, batch_size=8)
        cell = part.loc[("2048", "8", method)]
        assert (cell["tokens_per_s"], cell["reference tokens_per_s"]) == (
            pytest.approx(mine),
            pytest.approx(fullkv),
        )
        assert cell["ratio"] == pytest.approx(mine / fullkv)
    assert part.loc[("2048", "8", "zsmerge"), "paper: ratio"] == pytest.approx(163.2 / 110.8)  # 1.47x
    assert part.loc[("2048", "8", "h2o"), "paper: ratio"] == pytest.approx(72.2 / 110.8)  # 0.65x
    assert part.loc[("1024", "8", "fullkv"), "paper: ratio"] == pytest.approx(1.0)
    depth = "its first 2 decoder layers" if scale == "cpu" else "every decoder layer"
    assert f"llama2-7b's shape with random weights, {depth}" in report.markdown
    cols = list(report.table.columns)  # the paper's tokens/s beside ours in the main table too
    assert cols.index("paper: tokens_per_s @ zsmerge") == cols.index("tokens_per_s @ zsmerge") + 1
    # the figure draws ratios: a truncated random model's tokens/s is not on the paper's scale
    (plot,) = report.plots
    assert set(plot.data["metric"]) == {"throughput (tokens/s), ratio"}
    batch8 = plot.data[plot.data["facet"] == "8"]  # the panel of batch 8 (paper scale: 4, 8, 16)
    ours = batch8[batch8["source"].isna()].set_index(["hue", "x"])
    paper = batch8[batch8["source"] == "paper"].set_index(["hue", "x"])
    assert ours.loc[("zsmerge", "2048"), "mean"] == pytest.approx(part.loc[("2048", "8", "zsmerge"), "ratio"])
    assert paper.loc[("zsmerge", "2048"), "value"] == pytest.approx(163.2 / 110.8)


def test_keepkv_table1_ratio_is_over_fullkv_at_batch_2_and_smoke_has_no_paper_ratio(tmp_path):
    store = ResultStore(tmp_path / "results")
    written = fill(store, "keepkv_table1", scale="cpu")
    _, jobs = sweep_jobs("keepkv_table1", "cpu")
    for job in jobs:  # an efficiency run's samples are its batch: batch 2 and 8 are shapes, not other samples
        store.write(written[job.run_id] | {"n_samples": job.cfg.runner.batch_size}, [])
    report = build("keepkv_table1", "cpu", store.root, tmp_path / "out")
    (part,) = [
        t for heading, t in report.parts.items() if heading.startswith("tokens_per_s over the reference")
    ]
    part = part.set_index(["method", "runner.batch_size"])
    fullkv = _tokens(written, jobs, "fullkv", batch_size=2)
    for method in ("fullkv", "h2o", "keepkv"):
        for batch in (2, 8):
            expected = _tokens(written, jobs, method, batch_size=batch) / fullkv
            assert part.loc[(method, str(batch)), "ratio"] == pytest.approx(expected)
    assert part.loc[("keepkv", "8"), "paper: ratio"] == pytest.approx(255.99 / 116.54)  # 2.2x
    assert part.loc[("h2o", "8"), "paper: ratio"] == pytest.approx(317.33 / 116.54)
    assert "Not paired" not in report.markdown
    smoke = ResultStore(tmp_path / "smoke")
    fill(smoke, "keepkv_table1")
    small = build("keepkv_table1", "smoke", smoke.root, tmp_path / "small")
    (part,) = [
        t for heading, t in small.parts.items() if heading.startswith("tokens_per_s over the reference")
    ]
    assert "ratio" in part and "paper: ratio" not in part  # SmolLM2's shape stands in for no paper model


def test_keepkv_maxbatch_ratio_is_over_fullkv_at_its_own_largest_batch(tmp_path):
    store = ResultStore(tmp_path / "results")
    written = fill(store, "keepkv_table1_maxbatch", scale="paper")
    _, jobs = sweep_jobs("keepkv_table1_maxbatch", "paper")
    report = build("keepkv_table1_maxbatch", "paper", store.root, tmp_path / "out")
    (part,) = [
        t for heading, t in report.parts.items() if heading.startswith("tokens_per_s over the reference")
    ]
    part = part.set_index("method")
    tokens = {j.choice("method"): written[j.run_id]["metrics"]["tokens_per_s"] for j in jobs}
    assert part.loc["keepkv", "ratio"] == pytest.approx(tokens["keepkv"] / tokens["fullkv"])
    assert part.loc["keepkv", "paper: ratio"] == pytest.approx(255.99 / 116.54)
    assert {j.cfg.runner.cuda_memory_fraction for j in jobs} == {0.567}  # the stated cap
