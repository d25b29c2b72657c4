"""``python -m reports`` on the command line: the store-wide summary, unknown names and renamed options
refused, and the command a near-miss hint prints runs as printed."""

from __future__ import annotations

import pytest

from runners.results.store import ResultStore
from tests.experiment_fixtures import write_quality


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
    (tmp_path / "r").mkdir()  # an empty store: the report lists the sweep's runs as missing
    assert main([*command[3:], "--results-dir", str(tmp_path / "r"), "--out", str(tmp_path / "out")]) == 0


#: Hostile command lines per reports entry point -> the one line each must print. ``{store}``
#: holds XSum quality runs only, ``{empty}`` is an existing folder without runs, ``{missing}`` does
#: not exist (and must not be created), ``{file}`` is a plain file.
HOSTILE_BY_ENTRY = {
    "reports": [
        ("budget --task xsum --results-dir {store} --out {file}", "--out {file} is a file, not a directory"),
        (
            "summary --results-dir {store} --out {file}/x",
            "--out {file}/x is under {file}, a file, not a directory",
        ),
        ("budget --results-dir {missing}", "results dir {missing} does not exist"),
        ("summary --results-dir {missing}", "results dir {missing} does not exist"),
        ("table --results-dir {missing}", "results dir {missing} does not exist"),
        ("zsmerge_table2 --results-dir {missing}", "results dir {missing} does not exist"),
        ("summary --results-dir {file}", "results dir {file} is not a directory"),
        ("summary --results-dir {empty}", "no run records under {empty}/runs"),
        ("runs --results-dir {empty}", "no run records under {empty}/runs"),
        ("runs --results-dir {store} --task ruler", "no runs under {store}/runs match the filters"),
        ("summary --results-dir {store} --resamples 0", "argument --resamples: {positive} (got '0') {help}"),
        (
            "summary --results-dir {store} --resamples -5",
            "argument --resamples: {positive} (got '-5') {help}",
        ),
        ("budget --results-dir {store} --bogus", "unrecognized arguments: --bogus {help}"),
        (
            "pareto --results-dir {store} --memory disk",
            "argument --memory: invalid choice: 'disk' {kv} {help}",
        ),
        (
            "memory --results-dir {store}",
            "no finished efficiency runs under {store}/runs match the filters; {eg}",
        ),
    ],
    "compare": [
        ("--bogus", "unrecognized arguments: --bogus (see python -m reports.compare --help)"),
        ("{missing}", "results dir {missing} does not exist"),
        ("--results-dir {empty}", "no run records under {empty}/runs"),
        ("{store} --task ruler", "no finished quality runs of task ruler under {store}/runs"),
    ],
    "efficiency": [
        ("--bogus", "unrecognized arguments: --bogus (see python -m reports.efficiency --help)"),
        ("--results-dir {missing}", "results dir {missing} does not exist"),
        ("{store}", "no efficiency, error or OOM records under {store}/runs"),
    ],
}
HOSTILE = [(entry, argv, line) for entry, cases in HOSTILE_BY_ENTRY.items() for argv, line in cases]
#: The long parts of :data:`HOSTILE`'s lines.
WORDS = {
    "help": "(see python -m reports --help)",
    "positive": "must be a positive integer",
    "kv": "(choose from 'kv', 'peak')",
    "eg": "run e.g. `python run.py runner=efficiency runner.curve_every=32 method=zsmerge budget=128`",
}


def _entry(name: str):
    from reports.__main__ import main as reports_main
    from reports.compare import main as compare_main
    from reports.efficiency import main as efficiency_main

    return {"reports": reports_main, "compare": compare_main, "efficiency": efficiency_main}[name]


@pytest.mark.parametrize(("entry", "argv", "line"), HOSTILE, ids=[f"{e} {a}" for e, a, _ in HOSTILE])
def test_every_hostile_reports_input_is_one_error_line_and_exit_2(tmp_path, capsys, entry, argv, line):
    from tests.report_fixtures import quality_runs

    paths = {k: tmp_path / k for k in ("store", "empty", "missing", "file")}
    quality_runs(ResultStore(paths["store"]), n=2)
    paths["empty"].mkdir()
    paths["file"].write_text("not a folder")
    before = sorted(tmp_path.rglob("*"))
    code = _entry(entry)(argv.format(**paths).split())
    captured = capsys.readouterr()
    assert (code, captured.err, captured.out) == (2, f"error: {line.format(**paths, **WORDS)}\n", "")
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no folder created


@pytest.mark.parametrize("entry", ["reports", "compare", "efficiency"])
def test_help_keeps_its_usage_text(capsys, entry):
    with pytest.raises(SystemExit) as exit_:
        _entry(entry)(["--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m reports")
