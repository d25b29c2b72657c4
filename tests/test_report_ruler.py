"""``python -m reports ruler`` on synthetic RULER records (no model): the leaderboard's numbers are
the records', FullKV leads, the ratio is ``1 - budget``, protocols and lengths never share a table
or a panel, runs on other samples are left out and named, and the files are written."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from reports import ruler, ruler_figure, ruler_table
from reports.__main__ import main
from reports.runs import Filters
from runners.results.store import ResultStore
from tests.report_fixtures import config, error_run, write_run
from tests.ruler_fixtures import RULER_TASKS, ruler_runs


def _board(store: ResultStore) -> tuple[pd.DataFrame, ruler.Rows]:
    found = ruler.rows(store, Filters())
    return ruler.leaderboard(found.frame), found


def _budget_run(store: ResultStore, template: dict, budget, unit: str = "prompt") -> dict:
    """A SnapKV run given ``budget=`` (no compression_ratio key) on ``template``'s samples."""
    lines = (store.run_dir(template["run_id"]) / "predictions.jsonl").read_text().splitlines()
    cfg = config("snapkv", budget, template["config"]["task"], {"name": "quality"}, unit)
    created = "2026-11-20T17:00:00+00:00"
    preds = [json.loads(line) for line in lines]
    return write_run(store, cfg, "snapkv", "ruler", created, metrics=template["metrics"], predictions=preds)


def test_leaderboard_numbers_order_and_ratio(tmp_path):
    store = ResultStore(tmp_path)
    records = {r["run_id"]: r for r in ruler_runs(store)}
    given_budget = _budget_run(
        store, next(iter(records.values())), 0.6
    )  # budget=0.6 given by the user: ratio 0.4
    records[given_budget["run_id"]] = given_budget
    board, found = _board(store)
    assert not found.pairing.unpaired and found.notes == []
    assert list(zip(board["label"], board["compression_ratio"], strict=True)) == [
        ("FullKV", 0.0),
        ("AdaKV-SnapKV", 0.25),
        ("AdaKV-SnapKV", 0.5),
        ("SnapKV", 0.25),
        ("SnapKV", pytest.approx(0.4)),
        ("SnapKV", 0.5),
    ]
    assert ruler.task_columns(board) == list(RULER_TASKS)
    for row in board.itertuples():
        (record,) = [records[rid] for rid in row.run_ids.split()]
        budget = record["config"]["budget"]
        assert row.budget == (1.0 if budget is None else budget)
        assert row.compression_ratio == pytest.approx(0.0 if budget is None else 1 - budget)
        assert row.avg == record["metrics"]["avg"]
        assert all(getattr(row, t) == record["metrics"][t] for t in RULER_TASKS)
        assert row.n == 2 * len(RULER_TASKS) and board.loc[row.Index, "n/vt"] == 2
        if record is given_budget:  # no efficiency recorded: no KV figures
            assert pd.isna(row.kv_mib) and pd.isna(row.kv_fraction)
            continue
        assert row.kv_mib == record["efficiency"]["kv_bytes_end_mean"] / 2**20
        assert row.kv_fraction == pytest.approx(row.budget)  # FullKV's 1 without the field


def test_the_table_ranks_rows_by_score_and_shows_the_kv_held(tmp_path):
    """Per ratio, best avg first (FullKV leads); the KV columns are the records' means."""
    store = ResultStore(tmp_path)
    ruler_runs(store, methods=("snapkv", "adakv_snapkv", "knorm"), ratios=(0.5, 0.25))
    board, _ = _board(store)
    text = ruler_table.markdown(board)
    lines = [line.split("|") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    header = [c.strip() for c in lines[0]]
    rows = [[c.strip() for c in line] for line in lines[1:]]
    ratio, avg, mib, frac = (header.index(c) for c in ("compression ratio", "avg", "KV MiB", "KV / FullKV"))
    assert rows[0][1] == "FullKV" and (rows[0][mib], rows[0][frac]) == (f"{20e6 / 2**20:.3g}", "1")
    shown = [(float(r[ratio]), -float(r[avg])) for r in rows[1:]]
    assert shown == sorted(shown) and len({r[1] for r in rows[1:]}) == 3
    assert all(r[frac] == f"{1 - float(r[ratio]):.3g}" for r in rows[1:])


def test_label_switch_names_rows_by_ratio_or_kept_fraction(tmp_path):
    store = ResultStore(tmp_path)
    ruler_runs(store, ratios=(0.25,))
    board, _ = _board(store)
    by_ratio, by_budget = ruler_table.markdown(board, "ratio"), ruler_table.markdown(board, "budget")
    assert "compression ratio" in by_ratio and "kept fraction" not in by_ratio
    assert "budget (kept fraction)" in by_budget and "compression ratio" not in by_budget
    ratio_row = next(line for line in by_ratio.splitlines() if line.startswith("| SnapKV"))
    budget_row = next(line for line in by_budget.splitlines() if line.startswith("| SnapKV"))
    assert ratio_row.split("|")[2].strip() == "0.25" and budget_row.split("|")[2].strip() == "0.75"
    assert ratio_row.split("|")[3:] == budget_row.split("|")[3:]
    for label, tick in (("ratio", "0.25"), ("budget", "0.75")):
        (ax,) = [a for a in ruler_figure.draw(board, label).fig.axes if a.get_visible()]
        assert ax.get_xlabel() == ruler_figure.AXES[label]
        assert [t.get_text() for t in ax.get_xticklabels()] == [tick]


def test_protocols_and_lengths_never_share_a_table_or_panel(tmp_path):
    store = ResultStore(tmp_path)
    runs = ruler_runs(store, query_aware=False)
    runs += ruler_runs(store, query_aware=True)
    runs += ruler_runs(store, methods=("knorm",), length=8192)
    records = {r["run_id"]: r for r in runs}
    board, found = _board(store)
    groups = list(board.groupby(ruler.GROUP, sort=False))
    assert [g for g, _ in groups] == [
        ("smollm2-135m", 4096, ruler.PROTOCOLS[False]),
        ("smollm2-135m", 4096, ruler.PROTOCOLS[True]),
        ("smollm2-135m", 8192, ruler.PROTOCOLS[False]),
    ]
    for (_, length, protocol), part in groups:
        assert part.iloc[0]["label"] == "FullKV" and part["reference"].sum() == 1
        for rid in " ".join(part["run_ids"]).split():
            task = records[rid]["config"]["task"]
            assert task["lengths"] == [length]
            if records[rid]["method"] != "fullkv":
                assert ruler.PROTOCOLS[task["query_aware"]] == protocol
    assert set(board.loc[board["length"] == 8192, "label"]) == {"FullKV", "KNorm"}
    plot = ruler_figure.draw(board, pairing=found.pairing)
    titles = [ax.get_title() for ax in plot.fig.axes if ax.get_visible()]
    assert titles == [f"smollm2-135m, {n:,} tokens\n{p}" for _, n, p in (g for g, _ in groups)]


def test_runs_on_other_samples_are_not_paired(tmp_path):
    store = ResultStore(tmp_path)
    ruler_runs(store, methods=("snapkv", "adakv_snapkv"))
    (fullkv, tova) = ruler_runs(store, methods=("tova",), ratios=(0.5,), first_id=1)
    board, found = _board(store)
    assert "TOVA" not in set(board["label"]) and set(board["run_ids"]).isdisjoint({tova["run_id"]})
    assert fullkv["run_id"] not in " ".join(board["run_ids"])  # its FullKV ran on the shifted ids too
    assert {u.run_id for u in found.pairing.unpaired} == {fullkv["run_id"], tova["run_id"]}
    text = ruler_table.markdown(board, "ratio", found.pairing)
    assert "## Not compared" in text and f"TOVA (run {tova['run_id'][:8]})" in text


def test_budgets_without_a_ratio_are_left_out_with_a_note(tmp_path):
    store = ResultStore(tmp_path)
    (fullkv,) = ruler_runs(store, methods=())
    slots = _budget_run(store, fullkv, 512)
    context = _budget_run(store, fullkv, 0.5, unit="context")
    board, found = _board(store)
    assert list(board["label"]) == ["FullKV"]
    assert {slots["run_id"], context["run_id"]}.isdisjoint(" ".join(board["run_ids"]).split())
    why = "has no compression ratio (a ratio is of the prompt's compressed tokens)"
    assert sorted(found.notes) == sorted(
        f"note: left out SnapKV (run {r['run_id'][:8]}): budget {shown} {why}"
        for r, shown in ((slots, "512 slots"), (context, "50% of context"))
    )


def test_runs_recorded_before_query_aware_count_as_query_aware(tmp_path):
    store = ResultStore(tmp_path)
    old = ruler_runs(store, methods=("snapkv",), ratios=(0.5,), query_aware=False)
    for record in old:  # as recorded before the key: no task.query_aware, no compression_ratio
        del record["config"]["task"]["query_aware"], record["config"]["compression_ratio"]
        store.write(record, [])
    board, found = _board(store)
    assert set(board["protocol"]) == {ruler.PROTOCOLS[True]}
    assert ruler.query_aware(old[0]) is None and ruler.query_aware(old[1]) is True
    assert found.notes == [
        f"note: SnapKV (run {old[1]['run_id'][:8]}) predates task.query_aware: "
        "counted as query-aware (its runner compressed the whole prompt)"
    ]


def test_several_lengths_in_one_run_join_each_length_table(tmp_path):
    store = ResultStore(tmp_path)
    ruler_runs(store, methods=(), length=4096)
    ruler_runs(store, methods=(), length=8192)
    preds, metrics = [], {}
    for length, score in ((4096, 100.0), (8192, 0.0)):
        preds += [
            {"id": f"{t}-len{length}-{k}", "meta": {"task": t, "length": length}, "metrics": {"score": score}}
            for t in RULER_TASKS
            for k in range(2)
        ]
        metrics |= {f"{t}/len{length}": score for t in RULER_TASKS} | {f"avg/len{length}": score}
    task = {"_target_": "tasks.ruler.Ruler", "lengths": [4096, 8192], "limit": 2, "query_aware": False}
    cfg = config("snapkv", 0.5, task, {"name": "quality"})
    write_run(store, cfg, "snapkv", "ruler", "2026-11-20T18:00:00+00:00", metrics=metrics, predictions=preds)
    board, found = _board(store)
    snap = board[board["label"] == "SnapKV"].set_index("length")
    assert not found.pairing.unpaired and list(snap.index) == [4096, 8192]
    assert list(snap["avg"]) == [100.0, 0.0] and list(snap["qa_1"]) == [100.0, 0.0]


def test_cli_writes_png_pdf_csv_and_markdown(tmp_path, capsys):
    store = ResultStore(tmp_path / "r")
    ruler_runs(store)
    out = tmp_path / "out"
    assert main(["ruler", "--results-dir", str(store.root), "--out", str(out), "--label", "budget"]) == 0
    printed = capsys.readouterr().out
    figures = {f"{stem}.{ext}" for stem in ("ruler", "ruler_scores") for ext in ("png", "pdf", "csv")}
    assert {p.name for p in out.iterdir()} == figures | {"ruler.md"}
    assert all((out / name).stat().st_size > 0 for name in figures)
    table = pd.read_csv(out / "ruler_scores.csv")
    assert list(table["label"]) == ["FullKV", "AdaKV-SnapKV", "AdaKV-SnapKV", "SnapKV", "SnapKV"]
    assert {"compression_ratio", "budget", "avg", *RULER_TASKS, "n/qa_1"} <= set(table.columns)
    assert "budget (kept fraction)" in printed and "compression ratio" not in printed
    assert (out / "ruler.md").read_text() in printed
    assert main(["ruler", "--results-dir", str(store.root), "--task", "xsum"]) == 2
    assert capsys.readouterr().err == "error: reports ruler reads task=ruler runs (got --task xsum)\n"
    error_run(ResultStore(tmp_path / "xsum_only"))  # a store without RULER runs
    assert main(["ruler", "--results-dir", str(tmp_path / "xsum_only")]) == 2
    assert capsys.readouterr().err.startswith("error: no finished RULER runs")


def test_other_reports_never_pool_the_two_protocols(tmp_path):
    """``reports budget`` / ``pareto`` / ``summary`` group runs by label: a query-agnostic run is
    labelled apart from a query-aware one of the same method and budget; FullKV stays one reference."""
    from reports.runs import runs_frame

    store = ResultStore(tmp_path)
    ruler_runs(store, methods=("snapkv",), ratios=(0.5,), per_task=1, query_aware=False)
    ruler_runs(store, methods=("snapkv",), ratios=(0.5,), per_task=1, query_aware=True)
    frame = runs_frame(store, Filters(task="ruler"))
    labels = frame.groupby("label")["run_id"].nunique().to_dict()
    assert labels == {"FullKV": 2, "SnapKV": 1, "SnapKV query_aware=false": 1}


def test_pareto_of_ruler_runs_says_why_it_draws_no_bars(tmp_path):
    """RULER's ``avg`` is a run-level mean of task means with no per-sample value: the pareto figure
    draws no interval and its caption says so (and where the paired intervals are), never "bars"."""
    from reports import pareto
    from tests.pairing_fixtures import caption as figure_caption

    store = ResultStore(tmp_path)
    ruler_runs(store, methods=("snapkv",), ratios=(0.5,), per_task=1)
    (plot,) = pareto.build(store, Filters(task="ruler"))
    assert plot.data["ci_low"].isna().all()
    caption = figure_caption(plot.fig)
    assert "no bars (avg has no per-sample values; paired intervals: python -m reports ruler)" in caption
    assert "bars: 95%" not in caption


def test_the_leaderboard_figure_draws_the_tables_differences_at_their_values(tmp_path):
    """The dot plot: one panel per ratio, each compressed setting a dot at the table's Δ FullKV with
    its interval as a bar, sorted best first, at its exact value (no sideways dodge); the companion
    score-vs-ratio figure draws every point at the ratio run."""
    from reports import ruler_dots

    store = ResultStore(tmp_path)
    ruler_runs(store)
    board, _ = _board(store)
    compared = ruler_table.paired(board, store, n_resamples=200)
    plot = ruler_dots.draw(compared.frame)
    frame = compared.frame[~compared.frame["reference"]]
    assert len(plot.data) == len(frame) and set(plot.data["level"]) == {0.25, 0.5}
    for level, part in plot.data.groupby("level"):
        assert list(part["vs_fullkv"]) == sorted(part["vs_fullkv"], reverse=True)
        want = frame[frame["compression_ratio"] == level].set_index("label")
        assert dict(zip(part["label"], part["vs_fullkv"], strict=True)) == want["vs_fullkv"].to_dict()
    axes = plot.fig.axes
    assert [ax.get_title(loc="left") for ax in axes] == [
        "compression ratio 0.25 (FullKV 100.0)",
        "compression ratio 0.5 (FullKV 100.0)",
    ]
    for ax, (_, part) in zip(axes, plot.data.groupby("level"), strict=True):
        dots = [line for line in ax.lines if line.get_marker() == "o"]
        drawn = sorted((float(line.get_ydata()[0]), float(line.get_xdata()[0])) for line in dots)
        assert [x for _, x in drawn][::-1] == list(part["vs_fullkv"])  # best on top, exact x
        bars = [line for line in ax.lines if line.get_marker() in ("None", "", None)]
        bars = [line for line in bars if line.get_linestyle() == "-"]  # not FullKV's dashed zero
        lows = sorted(float(min(line.get_xdata())) for line in bars)
        assert lows == sorted(part["vs_fullkv_low"].dropna())
    scores = ruler_figure.draw(compared.frame)
    (ax,) = [a for a in scores.fig.axes if a.get_visible()]
    methods = [line for line in ax.lines if "(reference" not in line.get_label()]  # not FullKV's
    assert len(methods) == 2
    for line in methods:
        xs = line.get_transform().transform(list(zip(line.get_xdata(), line.get_ydata(), strict=True)))
        assert (xs == ax.transData.transform(line.get_xydata())).all()
