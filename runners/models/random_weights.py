"""The ``random`` model source: a causal LM of a named shape (``runners.models.shapes.SHAPES``) with
random weights, for the runners that time and size a method (``runner=efficiency``, ``runner=oom``):
timings do not depend on weight values, so the papers' throughput tables run on the papers' shapes
without their checkpoints.

Config keys (``configs/model/random.yaml``): ``shape`` (a name of the table), ``num_layers`` (null:
the shape's depth; N keeps the first N decoder layers, every other size unchanged) and ``seed``
(of the weights; default 0). The model is built by transformers from the config alone, on its
device and in its dtype (no second copy: a 2-layer Llama-2-7B in float32 builds in seconds). It has
no files and no tokenizer; the synthetic runners feed random token ids within the vocabulary.
"""

from __future__ import annotations

from typing import NoReturn

import torch
from omegaconf import DictConfig

from runners.models.shapes import SHAPES
from tasks.errors import KVBenchError

#: The runners a random-weight model serves: they time and size, and score no output.
RANDOM_RUNNERS = frozenset({"efficiency", "oom"})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_random(cfg: DictConfig) -> None:
    """Check a ``random`` model config (reads nothing).

    Raises
    ------
    KVBenchError
        For a shape not in ``SHAPES``, a ``num_layers`` that is not an integer in ``[1, the shape's
        layers]`` or null, a ``seed`` that is not an integer, or a ``device_map`` (a random model is
        built on one device).
    """
    shape = cfg.get("shape")
    if shape not in SHAPES:
        raise KVBenchError(f"model.shape must be one of {sorted(SHAPES)}, got {shape!r}")
    depth = SHAPES[shape]["num_hidden_layers"]
    layers = cfg.get("num_layers")
    if layers is not None and not (_is_int(layers) and 1 <= layers <= depth):
        raise KVBenchError(
            f"model.num_layers must be an integer in [1, {depth}] ({shape} has {depth} layers) or null, "
            f"got {layers!r}"
        )
    if not _is_int(cfg.get("seed", 0)):
        raise KVBenchError(f"model.seed must be an integer, got {cfg.get('seed')!r}")
    if cfg.get("device_map") is not None:
        raise KVBenchError(
            "a random-weight model is built on one device (device=...): leave model.device_map null"
        )


def num_layers(cfg: DictConfig) -> int:
    """The decoder layers of a (checked) ``random`` config: ``num_layers``, else the shape's."""
    return cfg.get("num_layers") or SHAPES[cfg.shape]["num_hidden_layers"]


def random_config(cfg: DictConfig):
    """The transformers config (``LlamaConfig``) of a (checked) ``random`` model config: its shape's
    fields with ``num_hidden_layers`` = :func:`num_layers`."""
    from transformers import LlamaConfig

    return LlamaConfig(**(SHAPES[cfg.shape] | {"num_hidden_layers": num_layers(cfg)}))


def random_identity(cfg: DictConfig) -> dict:
    """What identifies a random model: ``format`` ``random``, ``shape``, ``num_layers`` (built),
    ``seed`` and ``dtype`` (``auto`` is float32); the weights follow from these on one device type."""
    dtype = cfg.get("dtype", "auto")
    return {
        "format": "random",
        "shape": cfg.shape,
        "num_layers": num_layers(cfg),
        "seed": cfg.get("seed", 0),
        "dtype": "float32" if dtype == "auto" else dtype,
    }


def random_name(cfg: DictConfig) -> str:
    """``random-<shape>``, with ``-<N>layers`` when the depth is truncated."""
    depth = SHAPES[cfg.shape]["num_hidden_layers"]
    layers = num_layers(cfg)
    return f"random-{cfg.shape}" + (f"-{layers}layers" if layers != depth else "")


def no_files(cfg: DictConfig) -> NoReturn:
    """A random model has no files to locate (no tokenizer, no weights on disk).

    Raises
    ------
    KVBenchError
        Always, naming the runners it serves.
    """
    runners = ", ".join(f"runner={r}" for r in sorted(RANDOM_RUNNERS))
    raise KVBenchError(
        f"model {cfg.get('name') or random_name(cfg)} has random weights and no files or tokenizer: "
        f"it serves {runners} with methods that need no tokenizer"
    )


def build_random(cfg: DictConfig, kwargs: dict, device: torch.device) -> torch.nn.Module:
    """Build the random model of a (checked) ``random`` config on ``device``, seeded with
    ``model.seed``, with transformers' ``from_config`` keyword arguments ``kwargs`` (``dtype``,
    ``attn_implementation``): the weights are made in place on the device, in the dtype.

    Returns
    -------
    torch.nn.Module
        The causal LM (``LlamaForCausalLM``), not yet in eval mode.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.get("seed", 0))
    with torch.device(device):
        return AutoModelForCausalLM.from_config(random_config(cfg), **kwargs)
