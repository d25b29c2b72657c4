"""The command line shared by every reports entry point (``python -m reports``, ``python -m
reports.compare``, ``python -m reports.efficiency``): bad input is one ``error:`` line on stderr and
exit code 2 before any work, as with ``run.py``; ``--help`` prints the usage."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from runners.results.sharded import ShardedStore
from runners.results.store import ResultStore
from tasks.errors import KVBenchError


class Parser(argparse.ArgumentParser):
    """An ``argparse`` parser whose errors (unknown flag, bad value) raise :class:`KVBenchError`
    with argparse's message and a pointer to ``--help``, instead of printing the usage."""

    def error(self, message: str) -> None:  # type: ignore[override]  # raises instead of exiting
        """Raise the parse error as a :class:`KVBenchError` (see ``--help``)."""
        raise KVBenchError(f"{message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1.

    Raises
    ------
    argparse.ArgumentTypeError
        For anything else (``0``, ``-5``, ``ten``).
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def default_results_dir() -> str:
    """``$KVBENCH_RESULTS_DIR``, else ``results``."""
    return os.environ.get("KVBENCH_RESULTS_DIR", "results")


def open_store(root: str | Path, need_records: bool = True) -> ResultStore:
    """The store under ``root`` as reports read it (``runners.results.sharded.ShardedStore``: a run split over
    shards is one run), which must be an existing directory (never created).

    Parameters
    ----------
    root : str | Path
        The results directory.
    need_records : bool
        Also require at least one run record (``runs/*/record.json``).

    Raises
    ------
    KVBenchError
        When ``root`` is missing or not a directory, or (``need_records``) holds no record.
    """
    path = Path(root)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise KVBenchError(f"results dir {path} {what}")
    if need_records and not any((path / "runs").glob("*/record.json")):
        raise KVBenchError(f"no run records under {path}/runs")
    return ShardedStore(path)


def check_out(out: Path) -> Path:
    """``out`` if reports can be written there: a directory, or a path whose nearest existing
    parent is a writable directory (it is created when the report is written).

    Raises
    ------
    KVBenchError
        When ``out`` or its nearest existing parent is a file, or that parent is not writable.
    """
    existing = next(p for p in (out, *out.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        what = "is a file" if existing == out else f"is under {existing}, a file"
        raise KVBenchError(f"--out {out} {what}, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise KVBenchError(f"--out {out}: {existing} is not writable")
    return out


def run(main: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """``main(argv)`` with bad input and I/O errors as one ``error:`` line and exit code 2."""
    try:
        return main(argv)
    except (KVBenchError, OSError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
