"""Fused ops of the decode hot path: the PyTorch reference (the specification, used on CPU)."""

from kernels.decode_attention import decode_attention

__all__ = ["decode_attention"]
