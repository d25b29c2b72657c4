"""Every report kind on a store holding FullKV on 3 samples and on 2, and methods (KVMerger at a
fixed theta among them) on the same 2: runs are compared only on the same sample ids, the others
are named with the reason; intervals stay inside the metric's range; only FullKV is a reference."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from reports import budget_figure, memory, niah, pareto
from reports.compare import main as compare_main
from reports.experiment import build
from reports.pairing import pair
from reports.runs import MIN_N, Filters, mean_interval
from reports.summary import render
from runners.results.store import ResultStore
from runners.sweeps.experiment_jobs import sweep_jobs
from tests.experiment_fixtures import fill
from tests.pairing_fixtures import KVMERGER_KEPT, UNEQUAL_SCORES, caption, unequal_niah_runs, unequal_store
from tests.report_fixtures import efficiency_runs

#: FullKV's mean on the samples the methods ran (ids 0 and 1), and on all three.
PAIRED_FULLKV = (UNEQUAL_SCORES["fullkv"]["0"] + UNEQUAL_SCORES["fullkv"]["1"]) / 2
ALL_FULLKV = sum(UNEQUAL_SCORES["fullkv"].values()) / 3


@pytest.fixture
def store(tmp_path) -> ResultStore:
    return unequal_store(tmp_path / "results")


def _not_paired(notes: list[str]) -> list[str]:
    return [n for n in notes if n.startswith("note: not paired")]


def test_pair_keeps_the_majority_sample_set_and_names_the_rest():
    runs = pd.DataFrame(
        {
            "run_id": ["f3", "f2", "h", "z", "o"],
            "method": ["fullkv", "fullkv", "h2o", "zsmerge", "h2o"],
            "label": ["FullKV", "FullKV", "H2O", "ZSMerge", "H2O"],
            "model": ["m", "m", "m", "m", "other"],
            "task": "xsum",
        }
    )
    two, three = frozenset("01"), frozenset("012")
    keys = {"f3": three, "f2": two, "h": two, "z": two, "o": three}
    result = pair(runs, keys)
    assert result.kept == ["f2", "h", "z", "o"] and result.samples[("m", "xsum")] == two
    (left,) = result.unpaired
    assert left.run_id == "f3" and "3 samples (ids 0, 1, 2)" in left.reason and "(2 shared)" in left.reason
    assert result.no_reference == [("other", "xsum")]  # another model: never compared with m's FullKV


def test_budget_reference_is_fullkv_on_the_same_samples(store):
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    (ax,) = plot.fig.axes
    references = [line for line in ax.get_lines() if "(reference" in line.get_label()]
    assert len(references) == 1 and references[0].get_ydata()[0] == pytest.approx(PAIRED_FULLKV)
    assert PAIRED_FULLKV != pytest.approx(ALL_FULLKV)
    (note,) = _not_paired(plot.notes)
    assert "FullKV" in note and "3 samples (ids 0, 1, 2)" in note and "2 samples (ids 0, 1)" in note
    assert "Not paired (other samples): FullKV on 3 samples" in caption(plot.fig)
    assert set(plot.data["n"]) == {2}


def test_pareto_draws_one_model_one_fullkv_star(store):
    (plot,) = pareto.build(store, Filters(task="xsum"))
    (ax,) = plot.fig.axes
    stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 1 and list(stars[0].get_ydata()) == [pytest.approx(PAIRED_FULLKV)]
    assert len(_not_paired(plot.notes)) == 1 and "Not paired" in caption(plot.fig)


def test_summary_ranks_on_the_same_samples_and_lists_the_rest(store, tmp_path):
    text, _, warnings = render(store, tmp_path / "out", n_resamples=50)
    budget_02 = text.split("## budget 0.2")[1].split("##")[0]
    assert f"FullKV (reference) |        1.00 |       1 | {PAIRED_FULLKV:.2f} n=2" in budget_02
    assert "n=3" not in text.split("## Not paired")[0]
    assert "## Compared samples\n\n- smollm2-135m, xsum: 2 samples (ids 0, 1)" in text
    assert "FullKV (run " in text.split("## Not paired")[1] and len(_not_paired(warnings)) == 1


def test_compare_prints_only_paired_runs_and_why_others_are_left_out(store, capsys):
    assert compare_main([str(store.root)]) == 0
    out = capsys.readouterr().out
    table = out.split("compared on the same samples")[0]
    assert "fullkv" in table and not any(line.split()[-9:-8] == ["3"] for line in table.splitlines())
    assert "compared on the same samples: smollm2-135m, xsum: 2 samples (ids 0, 1)" in out
    assert "note: not paired: FullKV" in out and "kept 48% of prompt" in out


def test_niah_panels_pair_on_sample_ids(tmp_path):
    store = ResultStore(tmp_path)
    runs = unequal_niah_runs(store)
    (plot,) = niah.build(store, Filters())
    assert set(plot.data["run_id"]) == {runs[1]["run_id"], runs[2]["run_id"]}  # FullKV on a, b
    (note,) = _not_paired(plot.notes)
    assert runs[0]["run_id"][:8] in note and "3 samples (ids a, b, c)" in note


def test_experiment_table_leaves_out_fullkv_on_other_samples(tmp_path):
    store = ResultStore(tmp_path / "results")
    written = fill(store, "zsmerge_table2")
    for record in written.values():
        ids = "012" if record["method"] == "fullkv" else "01"
        store.write(record, [{"id": i, "metrics": record["metrics"]} for i in ids])
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out")
    assert "fullkv" not in set(report.table["method"])  # no reference from other samples
    left = report.markdown.split("## Not paired")[1]
    assert "fullkv" in left and "3 samples (ids 0, 1, 2)" in left and "2 samples (ids 0, 1)" in left
    assert "## Missing or failed runs\n\nnone" in report.markdown
    (plot,) = report.plots
    legend = [t.get_text() for t in plot.fig.axes[-1].get_legend().get_texts()]
    assert any(t.startswith("FullKV: not paired") for t in legend)


def test_experiment_runs_on_one_sample_set_are_all_paired(tmp_path):
    store = ResultStore(tmp_path / "results")
    written = fill(store, "zsmerge_table2")
    _, jobs = sweep_jobs("zsmerge_table2", "smoke")
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out")
    assert "## Not paired" not in report.markdown and len(written) == len({j.run_id for j in jobs})
    assert "fullkv" in set(report.table["method"])


def test_memory_draws_one_row_of_panels_per_model(tmp_path):
    store = ResultStore(tmp_path)
    _, zsmerge = efficiency_runs(store)
    other = zsmerge | {"run_id": "other", "config": zsmerge["config"] | {"model": {"name": "other-model"}}}
    store.write(other, [])
    (plot,) = memory.build(store, Filters())
    assert len(plot.fig.axes) == 6 and {ax.get_title() for ax in plot.fig.axes} == {
        "smollm2-135m",
        "other-model",
    }
    assert plot.notes == ["note: no FullKV run of model other-model to compare with"]


# ----------------------------------------------------------------- intervals in the metric's range


def test_interval_is_clipped_to_the_metric_range_and_absent_below_min_n():
    scores = [100.0] * 5 + [40.0]  # mean 90; the t half-width (~26) passes 100
    mean, low, high = mean_interval(scores, "rouge1")
    assert mean == pytest.approx(90.0) and high == 100.0 and 0.0 < low < mean
    assert mean_interval(scores, "tokens_per_s")[2] > 100.0  # an unbounded metric is not clipped
    assert all(math.isnan(b) for b in mean_interval([10.0, 60.0] * ((MIN_N - 1) // 2), "rouge1")[1:])


def test_budget_axis_stays_in_range_at_two_samples(store, tmp_path):
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    (ax,) = plot.fig.axes
    assert 0.0 <= ax.get_ylim()[0] and ax.get_ylim()[1] <= 102.0  # 2% of room above the range
    assert f"No interval where n < {MIN_N} samples (smallest n = 2)" in caption(plot.fig)
    plot.save(tmp_path / "out")
    csv = pd.read_csv(tmp_path / "out" / "budget_xsum_rouge1.csv")
    assert csv["ci_low"].isna().all() and csv["ci_high"].isna().all()


def test_budget_band_is_clipped_at_the_metric_maximum(tmp_path):
    from tests.experiment_fixtures import write_quality

    store = ResultStore(tmp_path)
    write_quality(store, "f", "fullkv", None, [100.0] * 6)
    for b in (0.1, 0.2):
        write_quality(store, f"h{b}", "h2o", b, [100.0] * 5 + [40.0])
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    assert (plot.data["ci_high"] <= 100.0).all() and (plot.data["ci_high"] == 100.0).any()
    assert plot.fig.axes[0].get_ylim()[1] <= 102.0


# ----------------------------------------------------------------- only FullKV is a reference


def test_budget_places_an_outcome_budget_at_its_kept_fraction(store):
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    (ax,) = plot.fig.axes
    (kvmerger,) = [line for line in ax.get_lines() if line.get_label().startswith("KVMerger")]
    assert list(kvmerger.get_xdata()) == [KVMERGER_KEPT] and kvmerger.get_linestyle() == "None"
    assert "budget is an outcome" in kvmerger.get_label() and "reference" not in kvmerger.get_label()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10%", "20%", "48%"]
    row = plot.data[plot.data["label"] == "KVMerger"].iloc[0]
    assert row["budget_realised"] and not row["reference"] and row["budget"] == KVMERGER_KEPT


def test_summary_never_calls_kvmerger_a_reference(store, tmp_path):
    text, _, _ = render(store, tmp_path / "out", n_resamples=50)
    assert "KVMerger (reference)" not in text
    for section in text.split("## budget ")[1:]:
        ranked = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")][1:]
        assert [m for m in ranked if "reference" in m] == ["FullKV (reference)"]
    outcome = text.split("## budget as an outcome")[1]
    assert "KVMerger" in outcome and f"kept {100 * KVMERGER_KEPT:.0f}%" in outcome


def test_pareto_draws_kvmerger_as_a_point_not_a_star(store):
    (plot,) = pareto.build(store, Filters(task="xsum"))
    (ax,) = plot.fig.axes
    (container,) = [c for c in ax.containers if c.get_label().startswith("KVMerger")]
    line = container.lines[0]
    assert (
        "reference" not in container.get_label()
        and line.get_marker() == "D"
        and np.isclose(line.get_xdata()[0], 20e6 * KVMERGER_KEPT / 2**20)
    )
