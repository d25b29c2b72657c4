"""One process at a time per run: a lock per run id under the result store (docs/results.md).

Two identical runs started at once (a sweep repeated on two machines sharing a results dir, two
terminals) would both compute the whole run. The first to take the run's lock computes it; the
other waits for the lock, then finds the finished record and skips the run, as it skips any
finished run (``runners.output.record.stored_run``). A run that failed leaves no finished record: the
waiting one then computes it.

The lock is an OS file lock (``filelock``): the kernel drops it when its process ends, however it
ends, so a crash never leaves a lock that blocks later runs; the lock file itself stays, empty and
harmless, in ``<results_dir>/locks/``. A run's lock is held from the moment its id is known until
its runner returns (every runner of ``runners.registry.RUNNER_REGISTRY`` runs inside
:func:`run_locks`, a sweep's jobs included). A grid takes its settings' locks in run-id order, so
two grids never wait for each other in a circle.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

LOCKS = "locks"
_held: contextvars.ContextVar[ExitStack | None] = contextvars.ContextVar("kvbench_run_locks", default=None)


@contextmanager
def run_locks() -> Iterator[None]:
    """Hold every run lock taken in the body (:func:`lock_run`) until the body ends."""
    with ExitStack() as stack:
        token = _held.set(stack)
        try:
            yield
        finally:
            _held.reset(token)


def holding_run_locks(runner: Callable[..., dict]) -> Callable[..., dict]:
    """``runner`` run inside :func:`run_locks`: the run locks it takes are released when it returns
    or raises."""

    @functools.wraps(runner)
    def run(*args, **kwargs) -> dict:
        with run_locks():
            return runner(*args, **kwargs)

    return run


def lock_path(results_dir: str | Path, rid: str) -> Path:
    """The lock file of run ``rid``: ``<results_dir>/locks/<rid>.lock``."""
    return Path(results_dir) / LOCKS / f"{rid}.lock"


def lock_run(results_dir: str | Path, rid: str) -> None:
    """Take run ``rid``'s lock for the rest of the enclosing :func:`run_locks`, waiting (with one
    line on stdout) while another process holds it.

    Raises
    ------
    RuntimeError
        Outside :func:`run_locks` (the lock would never be released).
    """
    stack = _held.get()
    if stack is None:
        raise RuntimeError("lock_run needs an enclosing run_locks()")
    path = lock_path(results_dir, rid)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"run {rid} is running in another process; waiting for it to end", flush=True)
        lock.acquire()
    stack.callback(lock.release)
