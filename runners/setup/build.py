"""Building a run from its settings (``runners.setup.settings.RunSettings``, made at the door): method,
task and prompts.

Order (bad input fails before anything expensive): ``runners.setup.settings.read_settings`` (the
schema, results dir, device, seed) -> :func:`build_method` (budget, method, model config, method
assets) -> :func:`build_components` (the task) -> :func:`load_prompts` (tokenizer, data, prompt
ids). No function here loads weights or reads the composed config.
"""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from methods import METHOD_REGISTRY, CompressionMethod
from methods.seam.contract import AssetRequest
from runners.models.loading import load_tokenizer, resolve_model_config
from runners.models.paths import safe_name
from runners.models.sources import MODEL_SOURCES
from runners.setup.budget import validate_budget
from runners.setup.decode_rule import apply_decode_rule
from runners.setup.kernel_proof import check_kernels
from runners.setup.loaded import load_once
from runners.setup.options import check_quant_group
from runners.setup.schema import check_target, clamp_notes, model_facts, target_class
from runners.setup.settings import RunSettings
from tasks import TASK_REGISTRY, Task
from tasks.chat import template_kwargs
from tasks.errors import KVBenchError

#: ``method.checkpoint`` of a method run with untrained weights (``method=less_random``): its
#: speed and memory are real, its outputs are not, so runners that score outputs refuse it.
UNTRAINED_CHECKPOINT = "random"
#: Where a model config's weights come from, as command-line options (``model=...``).
MODEL_OPTIONS = {"hf": ("hf", "id"), "gguf": ("gguf", "path")}


def refuse_untrained(settings: RunSettings) -> None:
    """Runners that score a method's outputs (quality, attention error) refuse a method run with
    untrained weights (``method.checkpoint=random``, ``method=less_random``).

    Raises
    ------
    KVBenchError
        If the method config names the untrained checkpoint.
    """
    if settings.method.get("checkpoint") == UNTRAINED_CHECKPOINT:
        raise KVBenchError(
            f"method.checkpoint={UNTRAINED_CHECKPOINT} (method=less_random) has untrained kernels, for speed "
            f"and memory (runner=efficiency, runner=oom) only; runner={settings.runner.name} scores outputs "
            "and needs trained ones (method=less)"
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


def build_method(settings: RunSettings) -> CompressionMethod:
    """Validate budget, method and model config and build the method with its assets (no model).

    Raises
    ------
    KVBenchError
        For a bad budget, unknown method target, bad hyperparameters, bad model config, an
        unsupported architecture, a Triton kernel that fails its proof with ``kernels=triton``
        (``runners.setup.kernel_proof.check_kernels``) or a missing method asset (LESS kernels: the
        message gives the training command, with this run's :func:`model_options`; for a
        random-weight model, the untrained ``method=less_random``). Fills the
        model config's null fields from the model's own config
        (``runners.models.loading.resolve_model_config``).
    """
    try:
        validate_budget(settings.budget, settings.budget_unit)
    except ValueError as err:
        raise KVBenchError(str(err)) from err
    method = apply_decode_rule(settings, build_node(settings.method, "method", METHOD_REGISTRY))
    text = resolve_model_config(settings.model)
    facts = model_facts(settings.model, text)
    check_target(settings.method, "method", facts)  # the ranges that name the model's context or head_dim
    for note in clamp_notes(settings.method, facts):
        print(f"note: {note}", flush=True)
    quanto = settings.quant.name.startswith("quanto")
    check_quant_group(settings.quant_params.get("group"), facts["head_dim"], per_token=quanto)
    try:
        method.check_model(text)
    except ValueError as err:
        raise KVBenchError(f"method {method.label}: {err}") from err
    check_kernels(settings, text)
    model = settings.model
    try:
        method.attach_assets(
            AssetRequest(settings.paths.checkpoints_dir, model.name, settings.budget, settings.budget_unit)
        )
    except FileNotFoundError as err:
        if MODEL_SOURCES[model.loader].build is not None:  # random weights: nothing to train on
            raise KVBenchError(
                f"{str(err).split(';')[0]}: a random-weight model has no trained kernels; time untrained "
                f"ones with method.checkpoint={UNTRAINED_CHECKPOINT} (method=less_random)"
            ) from err
        raise KVBenchError(str(err).replace("<model options>", model_options(model))) from err
    if method.traits.probes:  # KVzip's reconstruction prompt: the tokenizer's chat template
        tokenizer = load_tokenizer(model)
        method.attach_tokenizer(tokenizer, chat_kwargs(model, tokenizer))
    return method


def build_components(settings: RunSettings) -> tuple[CompressionMethod, Task]:
    """Build the method and task of ``settings`` (no data, no model).

    Raises
    ------
    KVBenchError
        As :func:`build_method`, or for an unknown task target / bad task config.
    """
    method = build_method(settings)
    return method, build_node(settings.task, "task", TASK_REGISTRY)


def load_prompts(model: DictConfig, task: Task) -> tuple[object, list, list[torch.Tensor]]:
    """The tokenizer of ``model`` (the run's model node, ``RunSettings.model``), the task's samples and
    their encoded prompts ``[1, prompt]``; the task renders chat templates with
    ``model.chat_template_kwargs`` (``tasks.chat.template_kwargs``: null gives
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
    tokenizer = load_tokenizer(model)
    task.chat_template_kwargs = chat_kwargs(model, tokenizer)
    if task.chat_template == "none" and model.get("chat_template_kwargs") is not None:
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


def chat_kwargs(model: DictConfig, tokenizer) -> dict:
    """The chat template's keyword arguments: ``model.chat_template_kwargs`` of the run's model node
    (``tasks.chat.template_kwargs``).

    Raises
    ------
    KVBenchError
        For a ``model.chat_template_kwargs`` that is not a dict.
    """
    configured = model.get("chat_template_kwargs")
    configured = OmegaConf.to_container(configured) if isinstance(configured, DictConfig) else configured
    return template_kwargs(tokenizer, configured)


def run_budget(settings: RunSettings, method: CompressionMethod) -> float | int | None:
    """The budget the run compresses to: the configured one, or None where the method's traits say
    it does not apply (FullKV; KVMerger at a fixed ``theta`` and DuoAttention, whose kept fraction is
    an outcome)."""
    return settings.budget if method.traits.budget_applies else None
