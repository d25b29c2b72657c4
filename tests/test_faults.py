"""Fault injection: after each fault, every finished run's record and predictions are
byte-identical to what the clean run wrote, the store lists exactly the finished runs, and a rerun
completes the rest. Plus the bad input found once a run holds its lock: one ``error:`` line, exit 2,
no record (the rest of the bad-input matrix is tests/test_cli.py's).

Faults: SIGKILL of a sweep's process group mid-job, Ctrl-C of a single run, two sweeps and four
parallel submitit_local jobs into one results dir, a logger failing after a finished run, a
truncated record, a full disk while writing a record, and a sweep in one process whose jobs must
report their own peak memory.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runners.results.store import ResultStore
from tests.cli_runs import TINY, multirun, records, sweep_env
from tests.conftest import REPO

pytestmark = pytest.mark.integration


def snapshot(tmp_path: Path) -> dict[str, tuple[bytes, bytes]]:
    """``run_id -> (record.json bytes, predictions.jsonl bytes)`` of every finished run."""
    out = {}
    for path in (tmp_path / "results" / "runs").glob("*/record.json"):
        if json.loads(path.read_bytes()).get("status") == "ok":
            out[path.parent.name] = (path.read_bytes(), (path.parent / "predictions.jsonl").read_bytes())
    return out


def tiny(*overrides: str) -> list[str]:
    """``overrides`` plus the small-run settings they do not set themselves."""
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    return [*overrides, *(t for t in TINY if t.split("=", 1)[0] not in keys)]


def single(
    tmp_path: Path, data_dir: Path, *overrides: str, timeout: int = 600
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "run.py", *tiny(*overrides)]
    return subprocess.run(
        cmd, cwd=REPO, env=sweep_env(tmp_path, data_dir), capture_output=True, text=True, timeout=timeout
    )


def wait_for(predicate, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and not predicate():
        time.sleep(0.1)
    assert predicate(), "timed out"


def _foreground_signals() -> None:
    """In the child before exec: SIGINT as a foreground run has it (a suite started in the background
    of a non-interactive shell ignores SIGINT, and a child inherits that: Ctrl-C would not reach it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(tmp_path: Path, data_dir: Path, overrides: list[str], sig: signal.Signals) -> None:
    """Run ``run.py`` with ``overrides``, send ``sig`` 4 s after generation has begun (the model loaded,
    the records open), and check that it ends with exit code 130 and a last line ``interrupted``."""
    cmd = [sys.executable, "run.py", *overrides]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=sweep_env(tmp_path, data_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=_foreground_signals,
    )  # fmt: skip
    for line in proc.stdout:
        if line.startswith("generating "):
            break
    time.sleep(4.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)  # a loaded CI machine: the record is written after the signal
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err[-2000:]


def test_sigkill_of_a_sweep_mid_job_loses_no_finished_run(tmp_path, data_dir):
    sweep = ["method=h2o", "budget=0.1,0.2,0.3", "task.max_new_tokens=48"]
    cmd = [sys.executable, "run.py", "-m", *tiny(*sweep)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=sweep_env(tmp_path, data_dir), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True, text=True,
    )  # fmt: skip
    runs = tmp_path / "results" / "runs"
    wait_for(lambda: len(list(runs.glob("*/record.json"))) == 1)
    time.sleep(2.0)  # the second job is generating now
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = snapshot(tmp_path)
    assert len(before) == 1 and len(records(tmp_path)) == 1  # the store lists exactly the finished run
    assert not list(runs.glob("*/.record.json.*"))  # no half-written record left behind as a record
    resumed = subprocess.run(
        [sys.executable, "run.py", "-m", *tiny(*sweep)], cwd=REPO, env=sweep_env(tmp_path, data_dir),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = snapshot(tmp_path)
    assert len(after) == 3 and all(after[rid] == before[rid] for rid in before)  # byte-identical


def test_ctrl_c_of_a_single_run_records_interrupted_and_a_rerun_repeats_it(tmp_path, data_dir):
    done = single(tmp_path, data_dir, "method=h2o", "budget=0.2")
    assert done.returncode == 0, done.stderr[-3000:]
    before = snapshot(tmp_path)
    slow = ("method=h2o", "budget=0.1", "task.limit=12", "task.max_new_tokens=96")  # still generating at 4 s
    interrupt(tmp_path, data_dir, tiny(*slow), signal.SIGINT)
    recs = records(tmp_path)
    statuses = sorted(r["status"] for r in recs.values())
    assert statuses == ["interrupted", "ok"] and snapshot(tmp_path) == before
    rerun = single(tmp_path, data_dir, *slow)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(r["status"] for r in records(tmp_path).values()) == ["ok", "ok"]


def test_two_sweeps_and_four_parallel_submitit_jobs_share_one_store(tmp_path, data_dir):
    env = sweep_env(tmp_path, data_dir)
    sweeps = [
        ["hydra/launcher=submitit_local", "method=h2o,snapkv,streamingllm,zsmerge", "budget=0.2"],
        ["method=h2o,streamingllm", "budget=0.1"],
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "run.py", "-m", *tiny(*s)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in sweeps
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "Error" not in err and "Traceback" not in err, err[-3000:]
    recs = records(tmp_path)
    assert len(recs) == 6 and {r["status"] for r in recs.values()} == {"ok"}
    import pandas as pd

    table = pd.read_parquet(tmp_path / "results" / "table.parquet")
    assert sorted(table["run_id"]) == sorted(recs)  # rebuilt at each sweep's end from every record
    assert not list((tmp_path / "results").glob(".table.*"))  # no temp file left behind
    modes = {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "results").rglob("*") if p.is_file()}
    assert modes == {oct(0o666 & ~_umask())}  # records, predictions and tables share one mode


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_logger_failing_after_a_finished_run_changes_nothing(tmp_path, data_dir):
    boom = "+logger.boom._target_=tests.faults.FailingLogger"
    done = single(tmp_path, data_dir, "method=h2o", "budget=0.2", boom)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning: FailingLogger failed" in done.stderr
    (rid, (record, predictions)) = next(iter(snapshot(tmp_path).items()))
    assert json.loads(record)["status"] == "ok" and predictions.count(b"\n") == 1
    swept = multirun(tmp_path, data_dir, "method=h2o", "budget=0.2,0.3", boom)  # a sweep: same rule
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert snapshot(tmp_path)[rid] == (record, predictions)
    assert sorted(r["status"] for r in records(tmp_path).values()) == ["ok", "ok"]


def test_a_truncated_record_is_reported_by_path_and_rerun(tmp_path, data_dir):
    assert single(tmp_path, data_dir, "method=h2o", "budget=0.2").returncode == 0
    assert single(tmp_path, data_dir, "method=h2o", "budget=0.3").returncode == 0
    paths = sorted((tmp_path / "results" / "runs").glob("*/record.json"))
    victim = next(p for p in paths if json.loads(p.read_text())["config"]["budget"] == 0.3)
    keep = next(p for p in paths if p != victim)
    kept_bytes = keep.read_bytes()
    victim.write_bytes(victim.read_bytes()[:100])
    listing = subprocess.run(
        [sys.executable, "-m", "reports", "runs"], cwd=REPO, env=sweep_env(tmp_path, data_dir),
        capture_output=True, text=True,
    )  # fmt: skip
    assert listing.returncode == 0 and "Traceback" not in listing.stderr
    assert f"warning: unreadable record {victim}" in listing.stderr
    rerun = single(tmp_path, data_dir, "method=h2o", "budget=0.3")
    assert rerun.returncode == 0 and f"unreadable record {victim}" in rerun.stderr, rerun.stderr[-2000:]
    assert json.loads(victim.read_text())["status"] == "ok" and keep.read_bytes() == kept_bytes


def test_a_full_disk_while_writing_keeps_the_finished_record(tmp_path, monkeypatch):
    store = ResultStore(tmp_path / "results")
    record = {"run_id": "abc", "status": "ok", "metrics": {"x": 1}}
    path = store.write(record, [{"id": 1}])
    before = (path.read_bytes(), (path.parent / "predictions.jsonl").read_bytes())

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("runners.results.store.os.fsync", full)
    with pytest.raises(OSError, match="No space left"):
        store.write(record | {"metrics": {"x": 2}}, [{"id": 2}])
    assert (path.read_bytes(), (path.parent / "predictions.jsonl").read_bytes()) == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["predictions.jsonl", "record.json"]
    monkeypatch.undo()
    failed = store.write(record | {"status": "error", "error": "later failure"}, [])  # never over ok
    assert failed.read_bytes() == before[0]


def test_each_job_of_a_sweep_reports_its_own_peak_memory(tmp_path, data_dir, tokenizer):
    """Job 0 loads a ~400 MB model, job 1 a ~13 MB one, in one process: job 1's peak must be its own."""
    from tests.architectures import tiny_family

    folders = []
    for name, hidden in (("big", 1024), ("small", 64)):
        sizes = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "max_position_embeddings": 4096}
        model = tiny_family("llama", vocab_size=len(tokenizer), **sizes)
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        folders.append(str(tmp_path / name))
        del model
    result = multirun(tmp_path, data_dir, "model=hf", f"model.id={','.join(folders)}", "method=fullkv")
    assert result.returncode == 0, result.stderr[-3000:]
    peaks = {
        r["config"]["model"]["name"]: r["efficiency"]["peak_rss_bytes"] for r in records(tmp_path).values()
    }
    assert peaks["small"] < peaks["big"] - 200 * 2**20, peaks  # not the big job's high-water mark


BAD_INPUT = [
    (["method=zsmerge", "budget=0.0000001"], "leaves no context slot"),
    (["runner=oom", "runner.memory_cap_gb=0.5", "runner.high=2"], "runner.memory_cap_gb=0.5 leaves no room"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUT, ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_is_one_error_line_and_no_record(tmp_path, data_dir, run_py, overrides, message):
    proc = run_py(*tiny(*overrides), data_dir=str(data_dir))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-2000:]
    assert message in lines[0]
    assert "loading model" not in proc.stdout and not records(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"document": "a", "summary": "b", "id": "1"}\n{"document": "a", broken\n',
            "test.jsonl:2: invalid JSON",
        ),
        ('{"text": "a", "summary": "b", "id": "1"}\n', "test.jsonl:1: missing field(s) ['document']"),
    ],
)
def test_bad_data_rows_name_file_and_line(tmp_path, content, message):
    data = tmp_path / "data"
    (data / "xsum").mkdir(parents=True)
    (data / "xsum" / "test.jsonl").write_text(content)
    proc = single(tmp_path, data, "task.limit=2")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert lines[0].startswith(f"error: {data / 'xsum' / 'test.jsonl'}")


def test_sigterm_of_a_grid_records_every_setting_as_interrupted(tmp_path, data_dir):
    """``kill`` (SIGTERM) ends a run as Ctrl-C does; a grid's unfinished settings all say so."""
    grid = ["runner=quality_grid", "runner.methods=[fullkv,h2o]", "runner.budgets=[0.2]", "task.limit=4"]
    interrupt(tmp_path, data_dir, tiny(*grid, "task.max_new_tokens=64"), signal.SIGTERM)
    recs = list(records(tmp_path).values())
    assert sorted(r["method"] for r in recs) == ["fullkv", "h2o"]
    ended = [(r["status"], r["error"]) for r in recs]
    assert all(s == "interrupted" and "grid of 2 settings stopped" in e for s, e in ended), ended
