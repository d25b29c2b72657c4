"""The door of a run: the composed config read once, its options checked from the schema and made
into one typed :class:`RunSettings`, which every later step (``runners.setup.build``, the storage
kind, the runners) reads instead of the config.

Order of the door's checks (:func:`read_settings`): no option under an old name, the schema of
every config group (``runners.setup.schema.check_config``), a model the runner takes (random weights
only where nothing is scored: ``runners.models.sources.check_runner``), ``compression_ratio`` turned
into its budget, the result store (``paths.results_dir``), ``device``, ``seed``, ``rerun``. The checks that
need the model's config (budget against the method, ranges that name a model fact) come with the
build (``runners.setup.build.build_method``), still before any weights load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from runners.models.sources import check_runner
from runners.results.store import quant_of, renamed_in_config
from runners.setup.options import RUNNER_OPTIONS, Progress, QuantOptions
from runners.setup.paths import RESULTS, check_writable_dir
from runners.setup.schema import check_config
from tasks.errors import KVBenchError

#: Device types a run may name (``device=``, ``runner.device=``), besides ``auto``.
DEVICE_TYPES = ("cpu", "cuda", "mps")


@dataclasses.dataclass(frozen=True)
class Paths:
    """``paths=`` (configs/paths): the result store, Hydra's run logs and trained method assets."""

    results_dir: str
    log_dir: str | None
    checkpoints_dir: str | None


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """A run's options, checked at the door (:func:`read_settings`), once per job.

    The top-level options are typed values; ``quant`` and ``runner`` are instances of their option
    dataclasses (``runners.setup.options``); ``method``, ``task`` and ``model`` are their config
    nodes, checked against the classes their ``_target_`` names (the build instantiates them; the
    model's null fields are filled in place when its config is read,
    ``runners.models.loading.resolve_model_config``). A runner option interpolated from a model fact
    not read yet (``runner=train_less_paper``'s ``window_length: ${model.max_context}``) is None in
    ``runner``.

    ``config`` is the composed config as the door left it (``budget`` set from
    ``compression_ratio``); it is what a run is identified and recorded by
    (``runners.results.identity.run_config``), and what the result store and the loggers read.
    """

    config: DictConfig
    budget: float | int | None
    budget_unit: str
    decode_budget: object
    seed: int
    device: str | None
    kernels: str
    backend: str
    rerun: bool
    paths: Paths
    quant: QuantOptions
    #: The ``quant`` keys its config sets (besides ``name``): what its storage kind is made with.
    quant_params: Mapping[str, object]
    runner: Progress
    method: DictConfig
    task: DictConfig
    model: DictConfig


def check_device(device: str | None, key: str = "device") -> None:
    """Check a configured device before any model loads: ``auto``, ``cpu``, ``cuda``, ``cuda:N``
    (an index this machine has) or ``mps`` (where available).

    Raises
    ------
    KVBenchError
        For an unknown device string, or a device this machine does not have.
    """
    if device in (None, "auto"):
        return
    try:
        parsed = torch.device(str(device))
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in DEVICE_TYPES:
        raise KVBenchError(f"{key}={device} is not a device (use auto, cpu, cuda, cuda:N or mps)")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise KVBenchError(f"{key}={device}, but CUDA is not available to this torch; use {key}=cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise KVBenchError(f"{key}={device}, but this machine has {count} CUDA device(s)")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise KVBenchError(f"{key}={device}, but MPS is not available to this torch; use {key}=cpu")


def apply_compression_ratio(cfg: DictConfig) -> None:
    """Turn kvpress's ``compression_ratio`` (the fraction of the compressed tokens removed) into the
    budget it means: ``budget = 1 - compression_ratio``, a fraction of the prompt (of the context
    before the question in a query-agnostic run). The record keeps both (``config.budget``,
    ``config.compression_ratio``); the run's identity is the budget, so the two spellings of one
    setting are one run.

    Raises
    ------
    KVBenchError
        For a ratio outside ``[0, 1)``, with ``budget_unit=context``, or when ``budget=`` is also
        given on the command line.
    """
    ratio = cfg.get("compression_ratio")
    if ratio is None:
        return
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise KVBenchError(f"compression_ratio must be in [0, 1) (the fraction removed), got {ratio!r}")
    if cfg.budget_unit != "prompt":
        raise KVBenchError("compression_ratio is a fraction of the prompt; it takes budget_unit=prompt")
    if HydraConfig.initialized() and any(
        o.split("=")[0].lstrip("+~") == "budget" for o in HydraConfig.get().overrides.task
    ):
        raise KVBenchError(
            f"give budget or compression_ratio, not both (compression_ratio={ratio} is budget={1 - ratio:g})"
        )
    cfg.budget = round(1.0 - float(ratio), 12)


def _plain(node: DictConfig | None) -> dict:
    return {} if node is None else OmegaConf.to_container(node, resolve=True)


def read_settings(cfg: DictConfig) -> RunSettings:
    """The door: check the composed config ``cfg`` (module docstring) and make its :class:`RunSettings`.
    ``cfg.budget`` is set from ``compression_ratio`` (:func:`apply_compression_ratio`), so the record
    and the run's identity hold the budget that runs.

    Raises
    ------
    KVBenchError
        For an option a config file sets under its old name (``runners.results.store.RENAMED_OPTIONS``),
        the first option its schema refuses (``runners.setup.schema.check_config``), a model whose
        source does not serve the runner (``runners.models.sources.check_runner``), a bad compression
        ratio, a results dir that cannot be written (``runners.setup.paths.check_writable_dir``), a
        device this machine does not have (:func:`check_device`), a seed that is not an integer, or
        a ``rerun`` that is not a boolean.
    """
    renamed = renamed_in_config(cfg)
    if renamed is not None:
        raise KVBenchError(renamed)
    check_config(cfg)
    check_runner(cfg.model, cfg.runner.name)
    apply_compression_ratio(cfg)
    check_writable_dir(cfg.paths.results_dir, RESULTS)
    check_device(cfg.get("device"))
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise KVBenchError(f"seed must be an integer, got {seed!r}")
    if not isinstance(cfg.get("rerun"), bool):
        raise KVBenchError(f"rerun must be true or false, got {cfg.get('rerun')!r}")
    quant = {k: v for k, v in _plain(cfg.get("quant")).items() if k != "name"}
    runner = {k: v for k, v in _plain(cfg.runner).items() if not str(k).startswith("_")}
    return RunSettings(
        config=cfg,
        budget=cfg.budget,
        budget_unit=cfg.budget_unit,
        decode_budget=cfg.get("decode_budget"),
        seed=seed,
        device=cfg.get("device"),
        kernels=cfg.get("kernels", "auto"),
        backend=cfg.get("backend", "eager"),
        rerun=cfg.rerun,
        paths=Paths(cfg.paths.results_dir, cfg.paths.get("log_dir"), cfg.paths.get("checkpoints_dir")),
        quant=QuantOptions(name=quant_of(cfg), **quant),
        quant_params=quant,
        runner=RUNNER_OPTIONS.get(cfg.runner.name, Progress)(**runner),
        method=cfg.method,
        task=cfg.task,
        model=cfg.model,
    )


def at_budget(settings: RunSettings, budget: float | int) -> RunSettings:
    """``settings`` at another ``budget``, on a copy of its config: building one leaves the other's
    method and model nodes as they were (``runner=error`` checks each of its budgets so)."""
    config = OmegaConf.merge(settings.config, {"budget": budget})
    nodes = {"method": config.method, "task": config.task, "model": config.model}
    return dataclasses.replace(settings, config=config, budget=config.budget, **nodes)
