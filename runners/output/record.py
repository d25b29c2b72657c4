"""The parts of a run record every runner shares (docs/results.md): provenance fields, writing
the record atomically and feeding the loggers."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig

from runners.output.environment import (
    device_info,
    git_sha,
    package_versions,
    release_free_memory,
    reset_peak_memory,
)
from runners.results.lock import lock_run
from runners.results.store import (  # noqa: F401
    IDENTITY_RULES,
    SCHEMA_VERSION,
    ResultStore,
    run_config,
    run_id,
    setting_id,
)
from runners.setup.kernel_proof import decode_paths, start_decode_paths
from tasks.data import samples_fingerprint

#: The inputs :func:`identify_run` identified each run of this process by (run id -> inputs), which
#: :func:`new_record` stores in the record.
_inputs_of_run: dict[str, dict] = {}


def record_device(record: dict) -> torch.device:
    """The device a record's run measures (``device.type``/``index``; CPU when unknown)."""
    info = record.get("device") or {}
    return (
        torch.device(info.get("type", "cpu"), info.get("index"))
        if info.get("type") == "cuda"
        else torch.device("cpu")
    )


def in_multirun() -> bool:
    """Whether this process runs one job of a Hydra ``--multirun`` sweep."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_info() -> dict | None:
    """Where a multirun job comes from: the sweep directory, job number, experiment, overrides."""
    if not in_multirun():
        return None
    hc = HydraConfig.get()
    return {
        "dir": str(hc.sweep.dir),
        "job_num": hc.job.num,
        "experiment": hc.runtime.choices.get("experiment"),
        "overrides": list(hc.overrides.task),
    }


def presets() -> dict[str, str] | None:
    """The config presets the run was composed from (Hydra's choices for model, method, task,
    runner and experiment: ``method=zsmerge_xsum_paper``), None outside a Hydra app."""
    if not HydraConfig.initialized():
        return None
    choices = HydraConfig.get().runtime.choices
    return {group: choices.get(group) for group in ("model", "method", "task", "runner", "experiment")}


def new_record(rid: str, config: dict, method: str, task: str, device: torch.device, **fields) -> dict:
    """A record in state ``running`` with provenance (git sha, versions, device, config
    :func:`presets`), its ``setting_id`` and ``inputs`` (as :func:`identify_run` found them for
    ``rid``) and ``fields``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": rid,
        "setting_id": setting_id(config),
        "inputs": _inputs_of_run.get(rid),
        "status": "running",
        "error": None,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "versions": package_versions(),
        "device": device_info(device),
        "config": config,
        "method": method,
        "task": task,
        "sweep": sweep_info(),
        "presets": presets(),
    } | fields


def finish(cfg: DictConfig, store: ResultStore, record: dict, predictions: list[dict]) -> None:
    """Write the record (atomically, last) with its per-sample lines, then log it everywhere.

    The record is the result: a logger that fails afterwards (W&B, the table) is reported with
    one ``warning:`` line and changes nothing that was written."""
    store.write(record, predictions)
    log_record(cfg, record)


def log_record(cfg: DictConfig, record: dict) -> None:
    """Feed ``record`` to every configured logger (``cfg.logger``); a logger that cannot be built
    or fails is reported with one ``warning:`` line, never raised."""
    try:
        loggers = instantiate(cfg.logger).values()
    except Exception as err:
        print(
            f"warning: loggers not built ({type(err).__name__}: {err}); the record is stored", file=sys.stderr
        )
        return
    for logger in loggers:
        try:
            logger.log(record)
        except Exception as err:
            print(
                f"warning: {type(logger).__name__} failed for run {record['run_id']} "
                f"({type(err).__name__}: {err}); the record is stored",
                file=sys.stderr,
            )


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


def run_inputs(cfg: DictConfig, samples: list | None = None) -> dict:
    """What a run reads besides its config: ``model``, the identity of the weights
    (``runners.models.sources.model_identity``), and ``data``, the fingerprint of the task's
    samples (``tasks.data.samples_fingerprint``; null for synthetic prompts)."""
    from runners.models.sources import model_identity

    return {
        "model": model_identity(cfg.model),
        "data": None if samples is None else samples_fingerprint(samples),
    }


def identify_run(cfg: DictConfig, config: dict, samples: list | None = None) -> tuple[ResultStore, str]:
    """The store and the run id of ``config`` on its inputs (:func:`run_inputs` of the resolved
    model and ``samples``, the task's loaded samples; None for synthetic prompts)."""
    inputs = run_inputs(cfg, samples)
    rid = run_id(config, inputs)
    _inputs_of_run[rid] = inputs
    return ResultStore(cfg.paths.results_dir), rid


def claim_run(
    cfg: DictConfig, store: ResultStore, rid: str, config: dict, show: Callable[[dict], None]
) -> dict | None:
    """Take run ``rid``'s lock (``runners.results.lock.lock_run``: another process computing the same
    run is waited for), then return its finished record unless ``rerun`` is set (a finished run
    is not repeated: its record is shown with ``show``); None when the run is to be computed. A
    finished run of the same setting on other inputs (another model file, changed data) is named
    in one line and kept; this run gets its own id.

    Raises
    ------
    RuntimeError
        Outside ``runners.results.lock.run_locks``.
    """
    lock_run(store.root, rid)
    if not cfg.rerun and (done := store.finished(rid)) is not None:
        print(f"run {rid} already finished (rerun=true to repeat); stored result:")
        show(done)
        return done
    others = [r["run_id"] for r in store.of_setting(setting_id(config)) if r.get("status") == "ok"]
    if others:
        print(f"run {rid}: the finished run(s) {', '.join(others)} of this setting read another model "
              "or other data; they are kept and this run is stored beside them")  # fmt: skip
    return None


def stored_run(
    cfg: DictConfig, config: dict, show: Callable[[dict], None], samples: list | None = None
) -> tuple[ResultStore, str, dict | None]:
    """:func:`identify_run`, then :func:`claim_run`: the store, the run id and the run's finished
    record (None when it is to be computed)."""
    store, rid = identify_run(cfg, config, samples)
    return store, rid, claim_run(cfg, store, rid, config, show)


@contextmanager
def recording(
    cfg: DictConfig,
    store: ResultStore,
    record: dict,
    predictions: list[dict] | None = None,
    before_write: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Run the body and write the record whatever happens: an OOM is recorded as status ``oom``
    (and not raised), any other exception as ``error`` (and raised, marked ``kvbench_recorded``),
    Ctrl-C / SIGTERM (``KeyboardInterrupt``, ``SystemExit``) as ``interrupted`` (and raised);
    ``wall_seconds`` is set. The peak-memory window starts here (``reset_peak_memory``), so
    every run of a sweep process reports its own peak, and so does ``decode``, what the decode
    path ran (``runners.setup.kernel_proof.decode_paths``). A status the body set before raising (a grid's
    runner says which sample stopped it) is kept."""
    start = time.perf_counter()
    start_decode_paths()
    release_free_memory()
    reset_peak_memory(record_device(record))
    try:
        yield
    except Exception as err:
        if record["status"] == "running":  # a runner may have recorded the failure more precisely
            record.update(failure(err))
        if record["status"] != "oom":
            err.kvbench_recorded = True  # type: ignore[attr-defined]
            raise
    except BaseException as err:
        if record["status"] == "running":
            record.update(status="interrupted", error=f"{type(err).__name__}: interrupted".strip())
        raise
    finally:
        if record.get("status") == "running":  # a runner that returned without saying how it ended
            record.update(status="error", error="the runner ended without setting a status")
        record["wall_seconds"] = time.perf_counter() - start
        record["decode"] = decode_paths()
        if before_write is not None:
            before_write()
        finish(cfg, store, record, predictions or [])


def record_failure(cfg: DictConfig, err: BaseException) -> str:
    """Store an ``error``/``oom`` record for a job that failed before its run wrote one (bad input
    found by validation, a model that does not load) so a sweep shows it. Returns the run id."""
    try:
        method = instantiate(cfg.method)
    except Exception:  # the method config itself may be what is wrong
        method = None
    budget_applies = method.traits.budget_applies if method is not None else True  # as a sweep counts it
    config = run_config(cfg, budget_applies=budget_applies)
    inputs = {"model": None, "data": None}  # not read: the job failed before its run began
    rid = run_id(config, inputs)
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    name = getattr(method, "name", None) or choices.get("method", "")
    task = choices.get("task", "") if config.get("task") is not None else "synthetic"
    record = new_record(rid, config, name, task, torch.device("cpu")) | failure(err)
    record.update(device=None, inputs=inputs)
    finish(cfg, ResultStore(cfg.paths.results_dir), record, [])
    return rid
