"""Which decode-attention path runs, and the proof a Triton kernel passes before it does.

A Triton kernel (``kernels.triton_decode``, ``kernels.triton_ragged``) is compiled per device, dtype,
head_dim, GQA group and compile-time options (logits or probabilities, fused score update, bias).
On first use of such a key in a process, :func:`triton_proven` compiles it and compares it with the
PyTorch path (the specification) on a small case registered by the entry point (:data:`CASES`),
and keeps the verdict:

- ``kernels=auto``: a failed proof (an exception, or numbers outside :data:`TOLERANCE`) falls back
  to PyTorch, with one warning per key;
- ``kernels=triton``: a failed proof raises :class:`KernelProofError`.

A traced (compiled) step cannot run a proof: :func:`prove_all` proves every variant beforehand.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.switch import BACKEND

#: Device types on which ``kernels=auto`` takes the Triton kernels (where triton is installed).
AUTO_DEVICES = ("cuda",)
#: Looked up once: a compiled step traces :func:`triton_wanted`.
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
#: ``atol`` and ``rtol`` of the comparison with the PyTorch path, per dtype (the kernels accumulate
#: in float32; half-precision inputs round the scaled query and the probabilities before ``p V``).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}

log = logging.getLogger(__name__)


class KernelProofError(RuntimeError):
    """A Triton kernel asked for with ``kernels=triton`` failed its proof (the message says why)."""


@dataclass(frozen=True)
class Case:
    """How an entry point proves its kernel.

    Attributes
    ----------
    run : Callable
        ``run(device, dtype, head_dim, group, **options)`` runs the kernel and the PyTorch path on a
        small case and returns ``(kernel tensor, PyTorch tensor)`` pairs to compare.
    variants : tuple[dict[str, bool], ...]
        Every option set the entry point may call the kernel with.
    """

    run: Callable[..., list[tuple[torch.Tensor, torch.Tensor]]]
    variants: tuple[dict[str, bool], ...]


#: Entry point (``uniform``, ``ragged``) -> its :class:`Case`.
CASES: dict[str, Case] = {}
#: Key ``(entry point, device, dtype, head_dim, group, *options)`` -> None (proven) or why it failed.
VERDICTS: dict[tuple, str | None] = {}


def triton_wanted(device: torch.device) -> bool:
    """Whether the configured backend asks for the Triton kernels on ``device`` (before any proof)."""
    if BACKEND.value == "triton":
        return True
    return BACKEND.value == "auto" and device.type in AUTO_DEVICES and TRITON_INSTALLED


def describe(key: tuple) -> str:
    """``the Triton uniform decode kernel (cuda:0, bfloat16, head_dim 128, group 4, bias+fused)``."""
    kind, device, dtype, head_dim, group, *options = key
    on = "+".join(name for name, value in options if value) or "no options"
    name = str(dtype).removeprefix("torch.")
    return f"the Triton {kind} decode kernel ({device}, {name}, head_dim {head_dim}, group {group}, {on})"


def mismatch(pairs: list[tuple[torch.Tensor, torch.Tensor]], tol: float) -> str | None:
    """Why the kernel's tensors differ from PyTorch's beyond ``|a - b| <= tol + tol |b|``, or None."""
    for got, want in pairs:
        if got.shape != want.shape:
            return f"shape {tuple(got.shape)} where PyTorch gives {tuple(want.shape)}"
        diff = (got.float() - want.float()).abs()
        if not bool((diff <= tol + tol * want.float().abs()).all()):  # NaN fails too
            worst = float(diff.nan_to_num(float("inf")).max())
            return f"differs from PyTorch by up to {worst:.3g}, tolerance {tol:g}"
    return None


def prove(key: tuple) -> str | None:
    """Run the case of ``key``'s entry point (:data:`CASES`) on ``key``'s device, dtype, head_dim,
    group and options; None if the kernel matches PyTorch, else why not (one line)."""
    kind, device, dtype, head_dim, group, *options = key
    try:
        return mismatch(CASES[kind].run(device, dtype, head_dim, group, **dict(options)), TOLERANCE[dtype])
    except Exception as err:  # a kernel that does not compile or launch: any error
        lines = str(err).strip().splitlines()
        return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def triton_proven(
    kind: str, device: torch.device, dtype: torch.dtype, head_dim: int, group: int, **options: bool
) -> bool:
    """Whether the Triton kernel of entry point ``kind`` may run with these inputs: proven once per
    process and key (:func:`prove`); a failed proof is logged once (``kernels=auto``). Inside a
    traced step an unproven key takes PyTorch (:func:`prove_all` first).

    Raises
    ------
    KernelProofError
        With ``kernels=triton``, when the proof failed.
    """
    key = (kind, device, dtype, head_dim, group, *sorted(options.items()))
    if key not in VERDICTS:
        if torch.compiler.is_compiling():
            return False
        VERDICTS[key] = prove(key)
        if VERDICTS[key] is not None and BACKEND.value != "triton":
            log.warning("%s failed its check against PyTorch (%s); decode attention runs in PyTorch",
                        describe(key), VERDICTS[key])  # fmt: skip
    failure = VERDICTS[key]
    if failure is not None and BACKEND.value == "triton":
        raise KernelProofError(f"kernels=triton: {describe(key)} failed its check against PyTorch "
                               f"({failure}); use kernels=auto or kernels=torch")  # fmt: skip
    return failure is None


def prove_all(device: torch.device, dtype: torch.dtype, head_dim: int, group: int) -> None:
    """Prove every registered variant for this device, dtype, head_dim and GQA group, where the
    configured backend would take the Triton kernels there (:func:`triton_wanted`).

    Raises
    ------
    KernelProofError
        As :func:`triton_proven`.
    """
    if not triton_wanted(device):
        return
    device = torch.empty(0, device=device).device  # "cuda" -> "cuda:0", as the tensors' own device
    for kind, case in CASES.items():
        for options in case.variants:
            triton_proven(kind, device, dtype, head_dim, group, **options)
