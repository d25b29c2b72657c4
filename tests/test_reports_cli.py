"""``python -m reports`` on the command line: the store-wide summary, unknown names and renamed options
refused, and the command a near-miss hint prints runs as printed."""

from __future__ import annotations

from reports.store import ResultStore
from tests.test_experiment_reports import write_quality


def test_reports_cli_writes_the_summary_and_rejects_unknown_experiments(tmp_path, capsys):
    from reports.__main__ import main

    store = ResultStore(tmp_path / "r")
    write_quality(store, "b", "h2o", 0.2, [10.0, 20.0])
    assert main(["summary", "--results-dir", str(store.root), "--resamples", "100"]) == 0
    assert (store.root / "reports" / "summary.md").is_file()
    assert "fewer than 10 samples (smallest n = 2)" in capsys.readouterr().err  # n = 2: warned
    assert main(["reindex", "--results-dir", str(store.root)]) == 0
    assert "1 records moved" in capsys.readouterr().out  # the fixture's id "b" is not its config's hash
    assert main(["nope", "--results-dir", str(store.root)]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert main(["keepkv_table1", "runner.batch=8", "--results-dir", str(store.root)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: runner.batch is now runner.batch_size (write runner.batch_size=8)"
    (moved,) = store.records()
    assert moved["method"] == "h2o" and moved["run_id"] != "b" and not store.run_dir("b").exists()


def test_near_miss_hints_print_a_command_the_cli_accepts(tmp_path):
    """The hint's command puts overrides after ``--scale``: the CLI must parse them intermixed."""
    from reports.__main__ import main, parser
    from reports.experiment import _near_miss_lines

    lines = _near_miss_lines("zsmerge_fig4", "smoke", ["seed=0"], {"task.limit=2": 3})
    (hint,) = [line for line in lines if "include them" in line]
    command = hint.split("`")[-2].split()
    assert command[:3] == ["python", "-m", "reports"]
    args = parser().parse_intermixed_args(command[3:])
    assert (args.name, args.scale, args.overrides) == ("zsmerge_fig4", "smoke", ["seed=0", "task.limit=2"])
    assert main([*command[3:], "--results-dir", str(tmp_path / "r"), "--out", str(tmp_path / "out")]) == 0
