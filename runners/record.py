"""The parts of a run record every runner shares (docs/results.md): provenance fields, writing
the record atomically and feeding the loggers."""

from __future__ import annotations

import datetime as dt

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from runners.environment import device_info, git_sha, package_versions
from runners.results import SCHEMA_VERSION, ResultStore


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


def failure(err: BaseException) -> dict:
    """``status``/``error`` fields for an exception: ``oom`` for CUDA/CPU out-of-memory errors."""
    oom = isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(err)
    return {"status": "oom" if oom else "error", "error": f"{type(err).__name__}: {err}".splitlines()[0]}
