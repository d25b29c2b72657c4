"""Paired significance in the reports: each compressed setting's difference from FullKV and from a
``--baseline`` with a 95% paired bootstrap interval over sample ids (scipy's), stratified by task for
RULER's average; the RULER leaderboard's ranks with ties; no interval below 5 samples."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.stats import bootstrap

from reports.__main__ import main
from reports.compare import main as compare_main
from reports.paired import Difference, paired_difference, tied_ranks
from runners.results.store import ResultStore
from tests.report_fixtures import quality_runs, xsum_scored
from tests.ruler_fixtures import ruler_config, ruler_scored, ruler_scored_run

RESAMPLES = 2000
AT_10 = re.compile(r"\|\s*0\.1\s*\|")
CELL = re.compile(r"([+-]\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]")


def _gap(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return a.mean(axis=axis) - b.mean(axis=axis)


def _scipy(a: np.ndarray, b: np.ndarray, paired: bool) -> tuple[float, float]:
    res = bootstrap(
        (a, b), _gap, paired=paired, n_resamples=RESAMPLES, method="percentile",
        rng=np.random.default_rng(0),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _ids(values) -> dict[str, float]:
    return {str(i): float(v) for i, v in enumerate(values)}


def ruler_levels(store: ResultStore, ids: list[str], levels: dict[tuple[str, float | None], float]) -> None:
    """RULER runs (:func:`ruler_scored`) in which each ``(method, ratio)`` scores its level on every
    sample of ``ids``."""
    ruler_scored(store, {setting: dict.fromkeys(ids, level) for setting, level in levels.items()})


def test_the_paired_interval_is_scipys_paired_bootstrap():
    rng = np.random.default_rng(7)
    a, b = rng.uniform(0, 100, 15), rng.uniform(0, 100, 15)
    d = paired_difference(_ids(a), _ids(b), n_resamples=RESAMPLES, seed=0)
    assert d.n == 15 and d.mean == pytest.approx(a.mean() - b.mean())
    assert (d.low, d.high) == pytest.approx(_scipy(a, b, paired=True), abs=1e-12)
    assert (d.low, d.high) != pytest.approx(_scipy(a, b, paired=False), abs=1e-6)


def test_pairing_separates_what_unpaired_resampling_cannot(tmp_path, capsys):
    """Samples differ a lot (5 to 95) and the method loses 3 points on every one of them: the
    unpaired interval includes 0, the paired one, which compare prints, does not."""
    fullkv = {str(i): 5.0 + 10 * i for i in range(10)}
    method = {sid: v - 3 + (0.5 if int(sid) % 2 else -0.5) for sid, v in fullkv.items()}
    low, high = _scipy(np.array(list(method.values())), np.array(list(fullkv.values())), paired=False)
    assert low < 0 < high
    store = ResultStore(tmp_path)
    xsum_scored(store, {("fullkv", None): fullkv, ("h2o", 0.1): method})
    assert compare_main([str(tmp_path), "--resamples", str(RESAMPLES)]) == 0
    out = capsys.readouterr().out
    (cell,) = CELL.findall(out)
    assert float(cell[0]) == pytest.approx(-3.0) and float(cell[1]) < float(cell[2]) < 0
    assert "95% paired bootstrap over sample ids, 2,000 resamples, seed 0" in out and "n = 10 samples" in out


def test_ruler_average_is_resampled_within_tasks(tmp_path, capsys):
    """Every vt sample loses 100 points, every qa_1 sample none (3 vt and 9 qa_1 samples): the
    average loses exactly 50 in every stratified resample, while resampling ids across tasks
    would move it with the share of vt samples drawn."""
    ids = [f"vt-{k}" for k in range(3)] + [f"qa_1-{k}" for k in range(9)]
    fullkv = dict.fromkeys(ids, 100.0)
    method = {sid: 0.0 if sid.startswith("vt") else 100.0 for sid in ids}
    strata = {sid: sid.rsplit("-", 1)[0] for sid in ids}
    stratified = paired_difference(method, fullkv, strata, RESAMPLES)
    plain = paired_difference(method, fullkv, None, RESAMPLES)
    assert (stratified.mean, stratified.low, stratified.high) == (-50.0, -50.0, -50.0)
    assert plain.mean == -25.0 and plain.high - plain.low > 20
    store = ResultStore(tmp_path)
    ruler_scored(store, {("fullkv", None): fullkv, ("snapkv", 0.5): method})
    assert main(["ruler", "--results-dir", str(tmp_path), "--resamples", str(RESAMPLES)]) == 0
    out = capsys.readouterr().out
    assert "| -50.00 [-50.00, -50.00] |" in out
    assert "stratified by task, 2,000 resamples, seed 0" in out and "n = 12 samples" in out


def test_ranks_tie_the_settings_whose_interval_against_the_best_includes_zero():
    tied = {(1, 0), (3, 2)}

    def versus(i: int, j: int) -> Difference:
        return Difference(-1.0, -2.0, 0.5, 10) if (i, j) in tied else Difference(-5.0, -6.0, -4.0, 10)

    assert tied_ranks([10.0, 9.0, 5.0, 4.5, 1.0], versus) == [1, 1, 3, 3, 5]
    assert tied_ranks([3.0, 2.0], lambda i, j: Difference(-1.0, float("nan"), float("nan"), 4)) == [
        None,
        None,
    ]


def test_ruler_leaderboard_ranks_with_ties(tmp_path, capsys):
    ids = [f"{t}-{k}" for t in ("vt", "qa_1") for k in range(5)]
    good = {sid: 0.0 if sid == "vt-0" else 100.0 for sid in ids}
    store = ResultStore(tmp_path)
    ruler_scored(
        store,
        {
            ("fullkv", None): dict.fromkeys(ids, 100.0),
            ("snapkv", 0.5): good,
            ("tova", 0.5): dict(good),  # the same scores: not distinguishable from SnapKV
            ("knorm", 0.5): dict.fromkeys(ids, 0.0),
            ("streamingllm", 0.5): dict.fromkeys(ids, 0.0),
        },
    )
    assert main(["ruler", "--results-dir", str(tmp_path), "--resamples", str(RESAMPLES)]) == 0
    out = capsys.readouterr().out
    ranks = {
        row[1].strip(): row[3].strip()
        for row in (line.split("|") for line in out.splitlines())
        if len(row) > 4
    }
    assert ranks["SnapKV"] == ranks["TOVA"] == "1" and ranks["KNorm"] == ranks["StreamingLLM"] == "3"
    assert (
        ranks["FullKV"] == "–"
        and "Rank: at each compression ratio, decoding rule and storage kind the best avg is rank 1" in out
    )


def test_baseline_difference_is_at_the_same_ratio(tmp_path, capsys):
    ids = [f"{t}-{k}" for t in ("vt", "qa_1") for k in range(5)]
    levels = {("fullkv", None): 100.0, ("snapkv", 0.5): 60.0, ("snapkv", 0.75): 20.0}
    ruler_levels(ResultStore(tmp_path), ids, levels | {("tova", 0.5): 70.0, ("tova", 0.75): 40.0})
    args = ["ruler", "--results-dir", str(tmp_path), "--baseline", "snapkv", "--resamples", "200"]
    assert main(args) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| TOVA")]
    assert ["+10.00 [10.00, 10.00]" in rows[0], "+20.00 [20.00, 20.00]" in rows[1]] == [True, True]


def test_a_decode_time_run_is_ranked_and_compared_under_its_own_rule(tmp_path, capsys):
    """A method's decode-time run beside its leaderboard-rule run at the same ratio: the baseline is
    the run under the same rule (not ambiguous) and the decode-time run does not take rank 1 from
    the leaderboard rule's best."""
    ids = [f"{t}-{k}" for t in ("vt", "qa_1") for k in range(5)]
    store = ResultStore(tmp_path)
    ruler_levels(store, ids, {("fullkv", None): 100.0, ("tova", 0.5): 60.0, ("snapkv", 0.5): 50.0})
    task = ruler_config("tova", 0.5, 5, 4096)["task"] | {"decode_budget": False}
    protocol = {"decoding": "decode-time", "paper_decoding": "decode-time"}
    decode_time = {"task": task, "decode_budget": True}
    ruler_scored_run(store, "tova", 0.5, dict.fromkeys(ids, 90.0), "2026-11-21T11:00:00+00:00", decode_time,
                     protocol=protocol)  # fmt: skip
    args = ["ruler", "--results-dir", str(tmp_path), "--baseline", "tova", "--resamples", "200"]
    assert main(args) == 0
    rows = {
        r[1].strip(): r
        for r in (line.split("|") for line in capsys.readouterr().out.splitlines())
        if len(r) > 7
    }
    assert [rows[m][3].strip() for m in ("TOVA", "SnapKV", "TOVA decode-time")] == ["1", "2", "1"]
    assert (
        rows["SnapKV"][6].strip() == "-10.00 [-10.00, -10.00]" and rows["TOVA decode-time"][6].strip() == "–"
    )


def test_quantized_runs_are_rows_of_their_own_ranked_among_their_kind(tmp_path, capsys):
    """SnapKV over int8 storage beside SnapKV at the same ratio: two rows (never pooled as seeds),
    FullKV over int8 a row at ratio 0 (it evicts nothing), the baseline taken at the same kind."""
    ids = [f"{t}-{k}" for t in ("vt", "qa_1") for k in range(5)]
    store = ResultStore(tmp_path)
    ruler_levels(store, ids, {("fullkv", None): 100.0, ("snapkv", 0.5): 60.0, ("tova", 0.5): 70.0})
    int8 = {"quant": {"name": "int8"}}
    for i, (method, ratio, level) in enumerate(
        [("fullkv", None, 90.0), ("snapkv", 0.5, 40.0), ("tova", 0.5, 35.0)]
    ):
        ruler_scored_run(
            store, method, ratio, dict.fromkeys(ids, level), f"2026-11-21T11:0{i}:00+00:00", int8
        )
    args = ["ruler", "--results-dir", str(tmp_path), "--baseline", "snapkv", "--resamples", "200"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {
        r[1].strip(): [c.strip() for c in r[2:7]] for r in (line.split("|") for line in lines) if len(r) > 7
    }
    assert rows["FullKV quant=int8"] == ["0", "1", "90.00", "-10.00 [-10.00, -10.00]", "–"]
    assert rows["SnapKV"] == ["0.5", "2", "60.00", "-40.00 [-40.00, -40.00]", "–"]
    assert rows["SnapKV quant=int8"] == ["0.5", "1", "40.00", "-60.00 [-60.00, -60.00]", "–"]
    assert rows["TOVA quant=int8"] == ["0.5", "2", "35.00", "-65.00 [-65.00, -65.00]", "-5.00 [-5.00, -5.00]"]
    assert "from SnapKV at the same compression ratio, decoding rule and storage kind" in "\n".join(lines)
    assert main([*args, "--label", "budget"]) == 0  # FullKV over int8 keeps every token
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("|")[2].strip() for line in lines if line.startswith("| FullKV quant=int8")] == ["1"]


@pytest.mark.parametrize(
    ("baseline", "message"),
    [
        ("nosuch", "error: --baseline nosuch is not a method or preset (known: "),
        ("h2o", "error: --baseline h2o: no h2o run on the samples this report compares"),
    ],
)
def test_a_baseline_unknown_or_without_runs_is_one_error_line(tmp_path, capsys, baseline, message):
    ids = [f"vt-{k}" for k in range(5)]
    store = ResultStore(tmp_path / "store")
    ruler_levels(store, ids, {("fullkv", None): 100.0, ("snapkv", 0.5): 0.0})
    out = tmp_path / "out"
    cases = (
        (main, ["ruler", "--results-dir", str(store.root), "--out", str(out), "--baseline", baseline]),
        (compare_main, [str(store.root), "--baseline", baseline]),
    )
    for entry, args in cases:
        assert entry(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1
    assert not out.exists()


def test_no_interval_and_no_rank_below_five_paired_samples(tmp_path, capsys):
    ids = [f"vt-{k}" for k in range(4)]
    four = paired_difference(dict.fromkeys(ids, 0.0), dict.fromkeys(ids, 100.0), n_resamples=100)
    assert four.n == 4 and four.mean == -100.0 and not four.has_interval and four.text() == "-100.00"
    five = {f"vt-{k}": 10.0 * k for k in range(5)}
    assert paired_difference(five, dict.fromkeys(five, 0.0), n_resamples=100).has_interval
    ruler_levels(
        ResultStore(tmp_path), ids, {("fullkv", None): 100.0, ("snapkv", 0.5): 0.0, ("tova", 0.5): 50.0}
    )
    assert main(["ruler", "--results-dir", str(tmp_path), "--resamples", "100"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| ")}
    assert rows["SnapKV"][3].strip() == "–" and rows["SnapKV"][5].strip() == "-100.00"
    assert not CELL.search(out) and "no interval below n = 5" in out and "No rank without an interval" in out


def test_every_report_that_compares_methods_shows_the_same_paired_differences(tmp_path, capsys):
    """compare, summary and budget print ZSMerge's difference from FullKV and from H2O at 10% alike."""
    store = ResultStore(tmp_path / "store")
    quality_runs(store)
    common = ["--baseline", "h2o", "--resamples", str(RESAMPLES)]
    assert compare_main([str(store.root), *common]) == 0
    compared = next(
        line for line in capsys.readouterr().out.splitlines() if "zsmerge" in line and " 10%" in line
    )
    out = ["--results-dir", str(store.root), "--out", str(tmp_path / "out"), *common]
    assert main(["summary", *out]) == 0 and main(["budget", "--task", "xsum", *out]) == 0
    printed = capsys.readouterr().out
    cells = CELL.findall(compared)
    assert len(cells) == 2  # from FullKV and from H2O
    summary = printed.split("## budget 0.1")[1].split("## ")[0]
    budget = (tmp_path / "out" / "budget_xsum_rouge1.md").read_text()
    for text in (summary, budget):
        (line,) = [
            line
            for line in text.splitlines()
            if "| ZSMerge" in line and (line.startswith("| xsum") or AT_10.search(line))
        ]
        assert CELL.findall(line) == cells
    assert printed.count("Δ FullKV [95% CI]") == 4 and printed.count("Δ H2O [95% CI]") == 4


def test_experiment_table_lists_each_cells_paired_difference(tmp_path):
    from reports.experiment import build
    from runners.sweeps.experiment_jobs import sweep_jobs
    from tests.experiment_fixtures import fixture_record

    base, jobs = sweep_jobs("zsmerge_table2", "smoke")
    store = ResultStore(tmp_path / "store")
    scores = {}
    for job in {job.run_id: job for job in jobs}.values():
        rng = np.random.default_rng(len(scores))
        scores[job.run_id] = {str(i): float(v) for i, v in enumerate(rng.uniform(0, 40, 8))}
        per = [
            {"id": i, "metrics": dict.fromkeys(("rouge1", "rouge2", "rougeL"), v)}
            for i, v in scores[job.run_id].items()
        ]
        store.write(fixture_record(job, base.report) | {"task": "xsum"}, per)
    report = build("zsmerge_table2", "smoke", store.root, tmp_path / "out", baseline="h2o", n_resamples=500)
    section = report.markdown.split("## Paired differences from FullKV (95% CI)")[1].split("\n## ")[0]
    assert "| Δ FullKV [95% CI]" in section and "Δ H2O [95% CI]" in section and "n = 8 samples" in section
    runs = {(r["method"], r["config"]["budget"]): r["run_id"] for r in store.records()}
    d = paired_difference(scores[runs[("less", 0.1)]], scores[runs[("fullkv", None)]], n_resamples=500)
    row = next(
        line
        for line in section.splitlines()
        if line.startswith("| LESS") and AT_10.search(line) and "rouge1" in line
    )
    assert d.text() in row
