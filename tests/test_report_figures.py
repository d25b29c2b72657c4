"""The store-wide figures (budget, niah, pareto, memory) and tables from a fixture store written as
real runs write it: what the figures show is read back from the matplotlib objects."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from reports import budget_figure, memory, niah, pareto
from reports.runs import Filters
from reports.tables import latex, runs_table
from runners.results.store import ResultStore
from tasks.errors import KVBenchError
from tests.report_fixtures import BUDGETS, N_SAMPLES, check_latex, efficiency_runs, full_store, quality_runs


@pytest.fixture
def store(tmp_path) -> ResultStore:
    return full_store(tmp_path / "results")


def _legend(ax) -> tuple[str, list[str]]:
    legend = ax.get_legend() or ax.figure.legends[0]
    return legend.get_title().get_text(), [t.get_text() for t in legend.get_texts()]


def test_budget_figure_lines_reference_bands_and_units(store):
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    (ax,) = plot.fig.axes
    assert ax.get_xlabel() == "KV budget (% of each prompt)" and ax.get_ylabel() == "ROUGE-1 F1 (x100)"
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["5%", "10%", "20%"]
    title, labels = _legend(ax)
    assert title == "method (preset)"
    assert f"FullKV (reference, n={N_SAMPLES})" in labels
    assert {f"{m} (n={N_SAMPLES})" for m in ("H2O", "ZSMerge", "SnapKV")} <= set(labels)
    data = plot.data.set_index(["label", "budget_unit"])
    fullkv = data.loc[("FullKV", None)] if ("FullKV", None) in data.index else plot.data.iloc[0]
    reference = next(line for line in ax.get_lines() if line.get_label().startswith("FullKV"))
    assert reference.get_linestyle() == "--" and reference.get_ydata()[0] == pytest.approx(fullkv["mean"])
    for line in ax.get_lines():
        if line.get_label().startswith(("H2O", "ZSMerge", "SnapKV")):
            assert list(line.get_xdata()) == list(BUDGETS) and len(line.get_ydata()) == 3
    assert (plot.data["ci_low"] <= plot.data["mean"]).all() and (
        plot.data["mean"] <= plot.data["ci_high"]
    ).all()
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 3  # one band per method line
    for band, line in zip(bands, [x for x in ax.get_lines() if x.get_linestyle() == "-"], strict=True):
        verts = band.get_paths()[0].vertices
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
            ys = verts[np.isclose(verts[:, 0], x), 1]
            assert ys.min() <= y <= ys.max()  # the band contains the mean


def test_budget_points_are_means_of_the_per_sample_scores(store):
    points, metric, _ = budget_figure.quality_points(store, Filters(task="xsum"), "rougeL")
    assert metric == "rougeL" and set(points["n"]) == {N_SAMPLES}
    row = points[(points["label"] == "ZSMerge") & (points["budget"] == 0.2)].iloc[0]
    record = store.read(row["run_ids"])
    assert row["mean"] == pytest.approx(record["metrics"]["rougeL"])


def test_budget_units_never_share_an_axis(tmp_path):
    store = ResultStore(tmp_path)
    quality_runs(store, budget_unit="prompt")
    quality_runs(store, budget_unit="context", minute=20)
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    labels = sorted(ax.get_xlabel() for ax in plot.fig.axes)
    assert labels == ["KV budget (% of each prompt)", "KV budget (% of the context window)"]
    (one,) = budget_figure.build(store, Filters(task="xsum", budget_unit="context"))
    assert len(one.fig.axes) == 1


def test_budget_refuses_clearly(store, tmp_path):
    with pytest.raises(KVBenchError, match="several tasks"):
        budget_figure.build(store, Filters())
    with pytest.raises(KVBenchError, match="metric 'bleu' is not recorded"):
        budget_figure.build(store, Filters(task="xsum"), "bleu")
    with pytest.raises(KVBenchError, match="no finished quality runs"):
        budget_figure.build(ResultStore(tmp_path / "empty"), Filters(task="xsum"))


def test_niah_heatmap_per_method(store):
    (plot,) = niah.build(store, Filters())
    panels = [ax for ax in plot.fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title() for ax in panels] == ["FullKV", "ZSMerge @ 10% of prompt"]
    for ax in panels:
        assert (
            ax.get_xlabel() == "context length (tokens)" and ax.get_ylabel() == "needle depth (% of context)"
        )
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1,000", "2,000"]
    grid = panels[1].get_images()[0].get_array()
    assert grid.shape == (3, 2) and list(grid[:, 0]) == [0.0, 100.0, 100.0]  # the shallow needle is lost
    colorbar = next(ax for ax in plot.fig.axes if ax.get_label() == "<colorbar>")
    assert colorbar.get_ylabel() == "passkey accuracy (%)"


def test_pareto_front_and_memory_axis(store):
    (plot,) = pareto.build(store, Filters(task="xsum"))
    (ax,) = plot.fig.axes
    assert ax.get_xscale() == "log" and "MiB" in ax.get_xlabel() and ax.get_ylabel() == "ROUGE-1 F1 (x100)"
    front = pareto.front(plot.data, "kv_mib")
    assert front["kv_mib"].is_monotonic_increasing and front["mean"].is_monotonic_increasing
    assert "FullKV (reference, n=12)" in _legend(ax)[1]
    (peak,) = pareto.build(store, Filters(task="xsum"), memory="peak")
    assert peak.fig.axes[0].get_xlabel() == "peak process memory of the run (RSS, model included; MiB)"


def test_memory_panels_fullkv_grows_methods_stay_flat(store):
    (plot,) = memory.build(store, Filters())
    kv, mem, speed = plot.fig.axes
    assert kv.get_ylabel() == "KV cache held (MiB)" and "MiB" in mem.get_ylabel()
    assert speed.get_ylabel() == "decode throughput (tokens/s)"
    assert all(ax.get_xlabel() == "context (tokens)" for ax in (kv, mem, speed))
    lines = {line.get_label(): line for line in kv.get_lines()}
    full, zs = lines["FullKV"], lines["ZSMerge @ 64 slots"]
    assert full.get_linestyle() == "--" and np.all(np.diff(full.get_ydata()) > 0)
    assert np.ptp(zs.get_ydata()) == 0 and zs.get_ydata()[0] < full.get_ydata()[0]


def test_memory_without_curves_draws_one_point_per_run(tmp_path):
    store = ResultStore(tmp_path)
    for record in efficiency_runs(store):
        store.write(record | {"curve": None}, [])
    points = memory.curve_points(store, Filters())
    assert len(points) == 2 and set(points["context"]) == {384} and not points["from_curve"].any()


def test_figures_write_png_pdf_and_csv(store, tmp_path):
    (plot,) = budget_figure.build(store, Filters(task="xsum"))
    files = plot.save(tmp_path / "out")
    assert sorted(p.suffix for p in files) == [".csv", ".md", ".pdf", ".png"]  # .md: paired differences
    assert (tmp_path / "out" / "budget_xsum_rouge1.csv").read_text().startswith("model,task,method")


def test_runs_table_is_compact_and_sorted_by_time(store):
    table = runs_table(store)
    columns = ["time", "runner", "model", "method", "task", "budget", "n", "status", "error", "run"]
    assert list(table.columns) == columns
    assert list(table["time"]) == sorted(table["time"])
    failed = table[table["status"] == "error"].iloc[0]
    assert failed["error"].startswith("KVBenchError: something broke") and len(failed["error"]) <= 70
    assert set(table["budget"]) >= {"–", "5% of prompt", "64 slots"}
    assert not table.astype(str).apply(lambda c: c.str.contains("nan|<NA>")).any().any()


def test_latex_has_booktabs_and_multicolumn_groups_per_budget():
    import pandas as pd

    frame = pd.DataFrame({
        "method": ["FullKV", "H2O_x"], "rouge1 @ 0.2": [30.0, 29.5], "rouge2 @ 0.2": [11.0, None],
        "paper: rouge1 @ 0.2": [30.59, 30.83], "rouge1 @ 0.1": [30.0, 25.0], "rouge2 @ 0.1": [11.0, 9.0],
    })  # fmt: skip
    text = latex(frame, "Table 2: 5% & more")
    check_latex(text, 6)
    assert "\\multicolumn{3}{c}{20\\%}" in text and "\\multicolumn{2}{c}{10\\%}" in text
    assert "\\cmidrule(lr){2-4}" in text and "\\cmidrule(lr){5-6}" in text
    assert "rouge1 (paper)" in text and "H2O\\_x" in text and "5\\% \\& more" in text
    assert "\\begin{table}[t]" in text and "--" in text  # the missing cell; 5 data columns fit one column
    wide = latex(pd.concat([frame, frame.drop(columns="method").add_suffix("x")], axis=1), "wide")
    assert "\\begin{table*}" in wide


BLOCK_TORCH = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"reports must not import {name}")

sys.meta_path.insert(0, Block())
from reports.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "command",
    [["budget", "--task", "xsum"], ["niah"], ["pareto", "--task", "xsum"], ["memory"], ["runs"], ["summary"],
     ["table"], ["reindex"], ["zsmerge_fig4"]],
)  # fmt: skip
def test_every_command_runs_without_torch_and_honours_the_results_dir(store, tmp_path, command):
    """torch/transformers imports raise; the store comes from $KVBENCH_RESULTS_DIR or --results-dir."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = os.environ | {"PYTHONPATH": str(root), "KVBENCH_RESULTS_DIR": str(store.root)}
    for extra in ([], ["--results-dir", str(store.root)]):
        run_env = env if not extra else env | {"KVBENCH_RESULTS_DIR": str(tmp_path / "elsewhere")}
        argv = [sys.executable, "-c", BLOCK_TORCH, *command, *extra]
        done = subprocess.run(argv, env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "must not import" not in done.stderr
    if command[0] in ("budget", "niah", "pareto", "memory"):
        assert list((store.root / "reports").glob("*.png"))


def test_every_method_has_a_display_name_and_colour():
    """Reports name and colour every registered method by its default label (a method missing from
    ``reports.style.METHODS`` would show as its registry name in a spare colour)."""
    from methods import METHOD_REGISTRY
    from reports.style import METHODS

    labels = set()
    for cls in METHOD_REGISTRY.values():
        try:
            labels.add(cls().label)
        except (TypeError, ValueError):  # needs its scorer or head pattern: named through its presets
            continue
    assert labels - set(METHODS) == set()
    assert len({s.color for s in METHODS.values()}) == len(METHODS)
