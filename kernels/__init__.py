"""Fused ops of the decode hot path: the PyTorch specifications (the CPU path) and the Triton
kernels used on CUDA once proven (``kernels.proof``): uniform heads (``kernels.triton_decode``)
and ragged heads (``kernels.triton_ragged``)."""

from kernels.decode_attention import (
    decode_attention,
    decode_attention_torch,
    get_backend,
    set_backend,
    uses_triton,
)
from kernels.proof import KernelProofError, prove_all
from kernels.ragged_decode import ragged_decode_attention
from kernels.switch import BACKENDS, RAN

__all__ = [
    "BACKENDS",
    "RAN",
    "KernelProofError",
    "decode_attention",
    "decode_attention_torch",
    "get_backend",
    "prove_all",
    "ragged_decode_attention",
    "set_backend",
    "uses_triton",
]
