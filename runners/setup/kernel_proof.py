"""A run's side of the Triton kernel proofs (``kernels.proof``): the kernels proven for the run's
device, dtype, head_dim and GQA group before they are needed, and which decode path ran.

- ``kernels=triton`` proves every kernel variant at build, from the model config (no weights): a
  failure is one ``error:`` line before the model loads (:func:`check_kernels`).
- A compiled decode step proves them when it is built (:func:`prove_for_model`): a traced step
  cannot run a proof.
- Otherwise (``kernels=auto``, eager steps) each kernel is proven on its first call.
"""

from __future__ import annotations

import torch

from kernels.proof import KernelProofError, prove_all
from kernels.switch import BACKEND, RAN
from methods.seam.architecture import text_config
from runners.models.loading import DTYPES, resolve_device
from runners.setup.settings import RunSettings
from tasks.errors import KVBenchError

#: The record's ``decode`` keys (``kernels.switch.RAN``): the uniform and ragged decode-attention
#: kernels (``torch`` / ``triton``) and the decode steps (``eager`` / ``compiled``).
DECODE_PATHS = ("uniform", "ragged", "backend")


def attention_shape(config) -> tuple[int, int]:
    """``(head_dim, group)`` of a transformers text config: its ``head_dim`` (else hidden size /
    query heads) and the query heads per KV head."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return int(head_dim), heads // (getattr(config, "num_key_value_heads", None) or heads)


def check_kernels(settings: RunSettings, config) -> None:
    """With ``kernels=triton``, prove every Triton decode kernel variant for the run's device
    (``settings.device``), dtype (``settings.model.dtype``, resolved) and the attention shape of ``config``
    (the model's transformers text config), before any weights load.

    Raises
    ------
    KVBenchError
        Naming the kernel that failed its proof and why.
    """
    if BACKEND.get() != "triton":
        return
    try:
        prove_all(resolve_device(settings.device), DTYPES[settings.model.dtype], *attention_shape(config))
    except KernelProofError as err:
        raise KVBenchError(str(err)) from err


def prove_for_model(model: torch.nn.Module) -> None:
    """Prove the Triton decode kernels the configured backend would take for ``model`` (its first
    parameter's device and dtype, its attention shape), before a compiled step is traced.

    Raises
    ------
    kernels.proof.KernelProofError
        With ``kernels=triton``, for a kernel that failed its proof.
    """
    weight = next(model.parameters())
    prove_all(weight.device, weight.dtype, *attention_shape(text_config(model.config)))


def decode_paths() -> dict[str, str | None]:
    """The record's ``decode`` field: what ran since the run began (``kernels.switch.RAN``; several
    values joined by ``+``, null where nothing ran in this process)."""
    return RAN.summary(DECODE_PATHS)


def start_decode_paths() -> None:
    """Forget what earlier runs of this process ran (:func:`decode_paths` starts from here)."""
    RAN.clear()
