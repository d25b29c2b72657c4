"""Building a run from its config: the checks every runner shares, then method, task and prompts.

Order (bad input fails before anything expensive): :func:`check_run` (results dir, device, seed) ->
:func:`build_method` (budget, method, model config, method assets) -> :func:`build_components`
(the task) -> :func:`load_prompts` (tokenizer, data, prompt ids). No function here loads weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from methods import METHOD_REGISTRY, CompressionMethod
from methods.seam.contract import AssetRequest
from runners.models.loading import load_tokenizer, resolve_model_config
from runners.models.sources import safe_name
from runners.results.store import renamed_in_config
from runners.setup.budget import validate_budget
from runners.setup.decode_rule import apply_decode_rule
from runners.setup.kernel_proof import check_kernels
from runners.setup.loaded import load_once
from runners.setup.options import QuantOptions, check_quant_group
from runners.setup.paths import RESULTS, check_writable_dir
from runners.setup.schema import (
    check_config,
    check_node,
    check_target,
    clamp_notes,
    model_facts,
    target_class,
)
from tasks import TASK_REGISTRY, Task
from tasks.chat import template_kwargs
from tasks.errors import KVBenchError

#: ``method.checkpoint`` of a method run with untrained weights (``method=less_random``): its
#: speed and memory are real, its outputs are not, so runners that score outputs refuse it.
UNTRAINED_CHECKPOINT = "random"
#: Device types a run may name (``device=``, ``runner.device=``), besides ``auto``.
DEVICE_TYPES = ("cpu", "cuda", "mps")
#: Where a model config's weights come from, as command-line options (``model=...``).
MODEL_OPTIONS = {"hf": ("hf", "id"), "gguf": ("gguf", "path")}


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


def check_run(cfg: DictConfig) -> None:
    """The checks of the top-level config every runner shares: no option under an old name, ``device``,
    ``seed``, ``rerun``, the result store (``paths.results_dir``), and ``compression_ratio`` turned
    into its budget (:func:`apply_compression_ratio`).

    Raises
    ------
    KVBenchError
        For an option a config file sets under its old name (``runners.results.store.RENAMED_OPTIONS``), a
        device this machine does not have (:func:`check_device`), a seed that is not an integer, a
        ``rerun`` that is not a boolean, a results dir that cannot be written
        (``runners.setup.paths.check_writable_dir``), or a bad compression ratio.
    """
    renamed = renamed_in_config(cfg)
    if renamed is not None:
        raise KVBenchError(renamed)
    check_config(cfg)
    apply_compression_ratio(cfg)
    check_writable_dir(cfg.paths.results_dir, RESULTS)
    check_device(cfg.get("device"))
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise KVBenchError(f"seed must be an integer, got {seed!r}")
    if not isinstance(cfg.get("rerun"), bool):
        raise KVBenchError(f"rerun must be true or false, got {cfg.get('rerun')!r}")


def refuse_untrained(cfg: DictConfig) -> None:
    """Runners that score a method's outputs (quality, attention error) refuse a method run with
    untrained weights (``method.checkpoint=random``, ``method=less_random``).

    Raises
    ------
    KVBenchError
        If the method config names the untrained checkpoint.
    """
    if cfg.method.get("checkpoint") == UNTRAINED_CHECKPOINT:
        raise KVBenchError(
            f"method.checkpoint={UNTRAINED_CHECKPOINT} (method=less_random) has untrained kernels, for speed "
            f"and memory (runner=efficiency, runner=oom) only; runner={cfg.runner.name} scores outputs and "
            "needs trained ones (method=less)"
        )


def model_options(model: DictConfig) -> str:
    """The command-line options that select ``model`` (a resolved model config node) again:
    ``model=hf model.id=...`` or ``model=gguf model.path=...`` (plus ``model.name=...`` where the
    name is not the one derived from them), else the preset's name (``model=smollm2-135m``)."""
    if model.get("loader") not in MODEL_OPTIONS:
        return f"model={model.get('name')}"
    group, key = MODEL_OPTIONS[model.loader]
    origin = str(model.get(key)).rstrip("/")
    derived = safe_name(Path(origin).stem if group == "gguf" else origin.split("/")[-1])
    options = f"model={group} model.{key}={model.get(key)}"
    return options if model.get("name") in (None, derived) else f"{options} model.name={model.name}"


def registered_name(target: str | None, registry: dict) -> str | None:
    """The registry name of the class a config's ``_target_`` names, or None if it is not registered.

    The target is resolved, not compared as text: a class may be named through the package that
    exports it (``methods.keepkv.KeepKV``) rather than the module defining it
    (``methods.keepkv.method``)."""
    cls = target_class(target)
    return next((n for n, c in registry.items() if c is cls), None) if cls is not None else None


def build_node(node: DictConfig, group: str, registry: dict) -> object:
    """Instantiate a method or task config (``group``), turning bad names or values into one-line
    errors.

    Raises
    ------
    KVBenchError
        For a ``_target_`` outside ``registry``, a mandatory value left unset (``???``) or a value
        its class refuses.
    """
    target = node.get("_target_", "")
    if registered_name(target, registry) is None:
        raise KVBenchError(f"unknown {group} target {target!r} (known {group}s: {sorted(registry)})")
    missing = sorted(OmegaConf.missing_keys(node))  # full keys when the node sits in a run config
    if missing:
        names = ", ".join(key if key.startswith(f"{group}.") else f"{group}.{key}" for key in missing)
        raise KVBenchError(f"{names} must be set (the {group} config leaves it ???)")
    check_target(node, group)
    try:
        return instantiate(node)
    except Exception as err:  # hydra wraps the dataclass' ValueError/TypeError
        cause = err.__cause__ or err
        prefix = "" if isinstance(cause, KVBenchError) else f"invalid {group} config: "  # data read on build
        raise KVBenchError(f"{prefix}{cause}") from err


def build_method(cfg: DictConfig) -> CompressionMethod:
    """Validate budget, method and model config and build the method with its assets (no model).

    Raises
    ------
    KVBenchError
        For a bad budget, unknown method target, bad hyperparameters, bad model config, an
        unsupported architecture, a Triton kernel that fails its proof with ``kernels=triton``
        (``runners.setup.kernel_proof.check_kernels``) or a missing method asset (LESS kernels: the
        message gives the training command, with this run's :func:`model_options`). Fills the
        model config's null fields from the model's own config
        (``runners.models.loading.resolve_model_config``).
    """
    try:
        validate_budget(cfg.budget, cfg.budget_unit)
    except ValueError as err:
        raise KVBenchError(str(err)) from err
    method = apply_decode_rule(cfg, build_node(cfg.method, "method", METHOD_REGISTRY))
    text = resolve_model_config(cfg.model)
    facts = model_facts(cfg.model, text)
    check_target(cfg.method, "method", facts)  # the ranges that name the model's context or head_dim
    for note in clamp_notes(cfg.method, facts):
        print(f"note: {note}", flush=True)
    check_node(cfg.get("quant") or {}, QuantOptions, "quant")
    check_quant_group((cfg.get("quant") or {}).get("group"), facts["head_dim"])
    try:
        method.check_model(text)
    except ValueError as err:
        raise KVBenchError(f"method {method.label}: {err}") from err
    check_kernels(cfg, text)
    try:
        method.attach_assets(
            AssetRequest(cfg.paths.checkpoints_dir, cfg.model.name, cfg.budget, cfg.budget_unit)
        )
    except FileNotFoundError as err:
        raise KVBenchError(str(err).replace("<model options>", model_options(cfg.model))) from err
    if method.traits.probes:  # KVzip's reconstruction prompt: the tokenizer's chat template
        tokenizer = load_tokenizer(cfg.model)
        method.attach_tokenizer(tokenizer, chat_kwargs(cfg, tokenizer))
    return method


def build_components(cfg: DictConfig) -> tuple[CompressionMethod, Task]:
    """Validate the config and build the method and task (no data, no model).

    Raises
    ------
    KVBenchError
        As :func:`build_method`, or for an unknown task target / bad task config.
    """
    method = build_method(cfg)
    return method, build_node(cfg.task, "task", TASK_REGISTRY)


def load_prompts(cfg: DictConfig, task: Task) -> tuple[object, list, list[torch.Tensor]]:
    """The tokenizer, the task's samples and their encoded prompts ``[1, prompt]``; the task renders
    chat templates with ``model.chat_template_kwargs`` (``tasks.chat.template_kwargs``: null gives
    ``enable_thinking=false`` where the template reads it), recorded in its protocol. The jobs of a
    multirun in one process load a task in the same state once (``runners.setup.loaded.load_once``).

    A note says once when ``model.chat_template_kwargs`` is set but ``task.chat_template=none``.

    Raises
    ------
    KVBenchError
        If the task selects no samples (and as ``Task.load`` for missing or unreadable data), or for
        a ``model.chat_template_kwargs`` that is not a dict or names a variable the template never
        reads.
    """
    tokenizer = load_tokenizer(cfg.model)
    task.chat_template_kwargs = chat_kwargs(cfg, tokenizer)
    if task.chat_template == "none" and cfg.model.get("chat_template_kwargs") is not None:
        print(
            "note: task.chat_template=none renders no chat template: model.chat_template_kwargs does not "
            "apply to the prompts",
            flush=True,
        )

    def load() -> tuple[list, list[torch.Tensor]]:
        samples = task.load(tokenizer)
        if not samples:
            raise KVBenchError(f"task {task.name} selected no samples")
        return samples, [task.encode(tokenizer, s) for s in samples]

    return tokenizer, *load_once(task, tokenizer, load)


def chat_kwargs(cfg: DictConfig, tokenizer) -> dict:
    """The chat template's keyword arguments: ``model.chat_template_kwargs`` (``tasks.chat.template_kwargs``).

    Raises
    ------
    KVBenchError
        For a ``model.chat_template_kwargs`` that is not a dict.
    """
    configured = cfg.model.get("chat_template_kwargs")
    configured = OmegaConf.to_container(configured) if isinstance(configured, DictConfig) else configured
    return template_kwargs(tokenizer, configured)


def run_budget(cfg: DictConfig, method: CompressionMethod) -> float | int | None:
    """The budget the run compresses to: the configured one, or None where the method's traits say
    it does not apply (FullKV; KVMerger at a fixed ``theta`` and DuoAttention, whose kept fraction is
    an outcome)."""
    return cfg.budget if method.traits.budget_applies else None
