"""Two identical runs started at once compute the run once: the second waits for the first's run
lock, then skips the finished run; a grid takes the same locks; a crashed holder blocks nothing."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time

import pytest
from filelock import FileLock, Timeout

from runners.output import record
from runners.registry import run_from_config
from runners.results.store import ResultStore
from tests.conftest import REPO
from tests.store_runs import composed, tiny_quality

ROW = {"document": "Rain fell on the town all day, and the river rose.", "summary": "Rain.", "id": "1"}


@pytest.fixture(scope="module")
def setting(tmp_path_factory, tokenizer) -> list[str]:
    """Overrides of a tiny quality run: a random Llama with the embedded tokenizer, one XSum row."""
    return tiny_quality(tmp_path_factory.mktemp("lock"), tokenizer, [ROW], max_new_tokens=4)


def race(monkeypatch, first: tuple[str, object], second: tuple[str, object]) -> tuple[dict, list[str]]:
    """Run ``first`` and ``second`` (``(module that loads the model, config)``) in two threads: the
    second starts once the first is loading its model, and the first goes on only once the second
    has identified its run (and 0.5 s more: time to pass an unlocked "already finished" check).
    Returns what each returned and the threads that loaded a model."""
    loading, identified, loaded = threading.Event(), threading.Event(), []
    inputs_of = record.run_inputs

    def run_inputs(*args, **kwargs):
        if threading.current_thread().name == "second":
            identified.set()
        return inputs_of(*args, **kwargs)

    def slow_load(load):
        def load_model(*args, **kwargs):
            loaded.append(threading.current_thread().name)
            loading.set()
            if threading.current_thread().name == "first":
                assert identified.wait(60)
                time.sleep(0.5)
            return load(*args, **kwargs)

        return load_model

    monkeypatch.setattr(record, "run_inputs", run_inputs)
    for module in {first[0], second[0]}:
        monkeypatch.setattr(f"{module}.load_model", slow_load(importlib.import_module(module).load_model))
    out: dict = {}

    def job(name: str, cfg) -> None:
        try:
            out[name] = run_from_config(cfg)
        except BaseException as err:  # a thread's failure is the test's
            out[name] = err

    threads = {name: threading.Thread(target=job, name=name, args=(name, cfg)) for name, (_, cfg) in
               (("first", first), ("second", second))}  # fmt: skip
    threads["first"].start()
    while not loading.wait(0.1):
        assert threads["first"].is_alive(), out
    threads["second"].start()
    for thread in threads.values():
        thread.join(300)
    return out, loaded


def test_two_identical_runs_at_once_compute_it_once(tmp_path, monkeypatch, capsys, setting):
    cfgs = [composed(tmp_path, "method=h2o", "budget=0.5", *setting) for _ in range(2)]
    out, loaded = race(monkeypatch, ("runners.quality", cfgs[0]), ("runners.quality", cfgs[1]))
    assert loaded == ["first"], loaded  # the second waited, then skipped the finished run
    assert out["first"] == out["second"] and isinstance(out["first"], float), out
    text = capsys.readouterr().out
    assert "is running in another process; waiting for it to end" in text and "already finished" in text
    (done,) = ResultStore(tmp_path / "results").records()
    assert done["status"] == "ok"


def test_a_grid_holds_its_settings_locks_until_they_are_written(tmp_path, monkeypatch, capsys, setting):
    grid = ("runner=quality_grid", "runner.methods=[h2o,snapkv]", "runner.budgets=[0.5]")
    grid = composed(tmp_path, *grid, *setting, monkeypatch=monkeypatch)
    single = composed(tmp_path, "method=snapkv", "budget=0.5", *setting)
    out, loaded = race(monkeypatch, ("runners.sweeps.quality_grid", grid), ("runners.quality", single))
    assert loaded == ["first"] and not isinstance(out["second"], BaseException), (loaded, out)
    assert "already finished" in capsys.readouterr().out
    records = ResultStore(tmp_path / "results").records()
    assert sorted(r["method"] for r in records) == ["h2o", "snapkv"] and all(r["grid"] for r in records)


@pytest.mark.integration
def test_two_identical_sweeps_at_once_compute_each_setting_once(tmp_path, setting):
    """A sweep repeated on two machines sharing the store (two processes, their own log dirs)."""
    sweep = [sys.executable, "run.py", "-m", "method=h2o", "budget=0.3,0.5", *setting]
    procs = [
        subprocess.Popen(sweep, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=os.environ | {"KVBENCH_RESULTS_DIR": str(tmp_path / "results"),
                                           "KVBENCH_LOG_DIR": str(tmp_path / f"logs{i}")})
        for i in range(2)
    ]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    stdout = "".join(out for out, _ in outs)
    assert stdout.count("loading model") == 2 and stdout.count("already finished") == 2, stdout[-3000:]
    assert [r["status"] for r in ResultStore(tmp_path / "results").records()] == ["ok", "ok"]


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    """The lock is the kernel's: it goes with its process (SIGKILL included); the empty file stays."""
    from runners.results.lock import lock_path, lock_run, run_locks

    hold = "import sys, time\nfrom runners.results.lock import lock_run, run_locks\nwith run_locks():\n"
    hold += "    lock_run(sys.argv[1], 'r1')\n    print('held', flush=True)\n    time.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(Timeout):  # held across processes
            FileLock(lock_path(tmp_path, "r1")).acquire(timeout=0.2)
    finally:
        proc.kill()
        proc.wait()
    assert lock_path(tmp_path, "r1").is_file()
    free = FileLock(lock_path(tmp_path, "r1"))
    free.acquire(timeout=5)  # not blocked
    free.release()
    with run_locks():
        lock_run(tmp_path, "r1")
    with pytest.raises(RuntimeError, match="run_locks"):
        lock_run(tmp_path, "r1")
