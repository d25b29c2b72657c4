"""The parts of a run record every runner shares (docs/results.md): provenance fields, writing
the record atomically and feeding the loggers."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from runners.environment import device_info, git_sha, package_versions
from runners.results import SCHEMA_VERSION, ResultStore, run_id


def new_record(rid: str, config: dict, method: str, task: str, device: torch.device, **fields) -> dict:
    """A record in state ``running`` with provenance (git sha, versions, device) and ``fields``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": rid,
        "status": "running",
        "error": None,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "versions": package_versions(),
        "device": device_info(device),
        "config": config,
        "method": method,
        "task": task,
    } | fields


def finish(cfg: DictConfig, store: ResultStore, record: dict, predictions: list[dict]) -> None:
    """Write the record (atomically, last) with its per-sample lines, then log it everywhere."""
    store.write(record, predictions)
    for logger in instantiate(cfg.logger).values():
        logger.log(record)


def is_oom(err: BaseException) -> bool:
    """Whether an exception is an out-of-memory failure (CUDA, Python or the CPU allocator)."""
    text = str(err)
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or any(
        s in text for s in ("can't allocate memory", "not enough memory", "std::bad_alloc")
    )


def failure(err: BaseException) -> dict:
    """``status``/``error`` fields for an exception: ``oom`` for out-of-memory errors (:func:`is_oom`)."""
    message = f"{type(err).__name__}: {err}".splitlines()[0]
    return {"status": "oom" if is_oom(err) else "error", "error": message}


def stored_run(
    cfg: DictConfig, config: dict, show: Callable[[dict], None]
) -> tuple[ResultStore, str, dict | None]:
    """The store, the run id of ``config``, and its finished record unless ``rerun`` is set
    (a finished run is not repeated: its record is shown with ``show`` and returned)."""
    rid = run_id(config)
    store = ResultStore(cfg.paths.results_dir)
    if not cfg.rerun and (done := store.finished(rid)) is not None:
        print(f"run {rid} already finished (rerun=true to repeat); stored result:")
        show(done)
        return store, rid, done
    return store, rid, None


@contextmanager
def recording(
    cfg: DictConfig,
    store: ResultStore,
    record: dict,
    predictions: list[dict] | None = None,
    before_write: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Run the body and write the record whatever happens: an OOM is recorded as status ``oom``
    (and not raised), any other exception as ``error`` (and raised); ``wall_seconds`` is set."""
    start = time.perf_counter()
    try:
        yield
    except Exception as err:
        record.update(failure(err))
        if record["status"] != "oom":
            raise
    finally:
        record["wall_seconds"] = time.perf_counter() - start
        if before_write is not None:
            before_write()
        finish(cfg, store, record, predictions or [])
