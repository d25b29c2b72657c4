"""Fused ops of the decode hot path: the PyTorch specification (the CPU path) and the Triton kernel
used on CUDA (``kernels.triton_decode``)."""

from kernels.decode_attention import (
    BACKENDS,
    decode_attention,
    decode_attention_torch,
    get_backend,
    set_backend,
    uses_triton,
)

__all__ = [
    "BACKENDS",
    "decode_attention",
    "decode_attention_torch",
    "get_backend",
    "set_backend",
    "uses_triton",
]
