"""``scripts/leaderboard.sh`` refuses a shard list it cannot run (one ``error:`` line, exit 2) before
``run.py`` starts, so that nothing is written: no run, no record, no log directory."""

from __future__ import annotations

import subprocess

import pytest

from tests.cli_runs import store_env
from tests.conftest import REPO


@pytest.mark.parametrize("grid", ["quant", "ratios"])
@pytest.mark.parametrize("shards", ["26", "-1", "abc", "", "26,27", "1,,2", "3,", "1,1", "007", "0x1", " 1"])
def test_a_bad_shard_list_is_one_error_line_and_nothing_written(tmp_path, grid, shards):
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "leaderboard.sh"), grid, shards],
        cwd=tmp_path, env=store_env(tmp_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("error:") and "0-25" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [[], ["quant"], ["quant", "1", "2"], ["bogus", "1"]])
def test_a_bad_call_is_one_error_line(tmp_path, args):
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "leaderboard.sh"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error:")
