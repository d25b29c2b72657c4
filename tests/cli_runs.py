"""``python run.py`` in a subprocess as a user runs it: one run (``run_cli``), a Hydra multirun
(``multirun``) with the tiny overrides, the records it left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runners.results.store import ResultStore
from tests.conftest import REPO


def store_env(tmp_path: Path) -> dict:
    """This process's environment with the results and logs of a run under ``tmp_path``."""
    return os.environ | {
        "KVBENCH_RESULTS_DIR": str(tmp_path / "results"),
        "KVBENCH_LOG_DIR": str(tmp_path / "logs"),
    }


def run_cli(tmp_path, *overrides: str, data_dir: str | None = None) -> subprocess.CompletedProcess:
    env = store_env(tmp_path) | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if data_dir is not None:
        env["KVBENCH_DATA_DIR"] = data_dir
    cmd = [sys.executable, "run.py", "logger=table", "runner.progress=false", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


TINY = ["task.limit=1", "task.max_new_tokens=4", "logger=table", "runner.progress=false"]


def sweep_env(tmp_path: Path, data_dir: Path) -> dict:
    return store_env(tmp_path) | {"KVBENCH_DATA_DIR": str(data_dir), "HYDRA_FULL_ERROR": "1"}


def multirun(tmp_path: Path, data_dir: Path, *overrides: str, timeout: int = 600):
    cmd = [sys.executable, "run.py", "-m", *overrides, *TINY]
    return subprocess.run(
        cmd, cwd=REPO, env=sweep_env(tmp_path, data_dir), capture_output=True, text=True, timeout=timeout
    )


def records(tmp_path: Path) -> dict[str, dict]:
    return {r["run_id"]: r for r in ResultStore(tmp_path / "results").records()}
