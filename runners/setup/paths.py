"""The directories a run writes (the result store, Hydra's run logs), checked before any work."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from tasks.errors import KVBenchError

RESULTS = "results dir (paths.results_dir, $KVBENCH_RESULTS_DIR)"
LOGS = "log dir (paths.log_dir, $KVBENCH_LOG_DIR)"


def check_writable_dir(path: str | Path, what: str) -> None:
    """Check that the directory ``path`` exists and can be written, or can be created: its nearest
    existing ancestor is a directory in which a file can be created (probed with a temporary file,
    removed at once, so that permissions, read-only file systems and root are judged alike).

    Raises
    ------
    KVBenchError
        Naming ``what`` and the path, if a component of the path is a file or nothing can be
        written where the directory is or would be created.
    """
    path = Path(path).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise KVBenchError(f"{what} {path} cannot be a directory: {existing} is a file")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".kvbench-write-check-")
    except OSError as err:
        raise KVBenchError(f"{what} {path} is not writable ({err.strerror} in {existing})") from err
    os.close(fd)
    os.unlink(probe)


class CheckOutputDirs(Callback):
    """Hydra callback: the result store and the run's log directory can be written, checked before
    Hydra creates the log directory and before any job starts. Hydra turns a callback's exception
    into a warning, so a failure ends the process here: one ``error:`` line, exit code 2."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A single run: ``paths.results_dir`` and ``hydra.run.dir``."""
        _check_or_exit(config, config.paths.results_dir, "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep: ``paths.results_dir`` and ``hydra.sweep.dir``."""
        _check_or_exit(config, config.paths.results_dir, "sweep")


def _check_or_exit(config: DictConfig, results_dir: str, mode: str) -> None:
    HydraConfig.instance().set_config(config)  # the log dir's ${hydra:...} interpolations
    try:
        check_writable_dir(results_dir, RESULTS)
        check_writable_dir(config.hydra[mode].dir, LOGS)
    except KVBenchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
