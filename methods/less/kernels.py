"""LESS kernels: the learned feature maps of one decoder layer (Dong et al., ICML 2024, Sec. 4;
docs/methods.md, "LESS"; from hdong920/LESS src/train_kernels.py).

``phi(q) = |GELU(GELU(q W1q) W2q)|`` per query head and
``psi(k) = |u + (u W3) * D2|`` with ``u = |D| * GELU(GELU(k W1k) W2k)`` per KV head, both on
post-RoPE inputs, mapping ``head_dim`` to ``rank`` (R = 8) non-negative features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LessKernels(nn.Module):
    """Feature maps of one layer.

    Parameters
    ----------
    q_heads, kv_heads, head_dim : int
        The layer's attention geometry (GQA: one key kernel per KV head).
    rank : int
        Feature dimension R of the low-rank state (8).
    hidden : int
        Hidden width of the two-layer kernels (512).
    dropout : float
        Dropout after the first kernel layer, active in training only (paper recipe: 0.3).
    """

    def __init__(
        self,
        q_heads: int,
        kv_heads: int,
        head_dim: int,
        rank: int = 8,
        hidden: int = 512,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)

        def init(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=gen) * shape[-2] ** -0.5)

        self.w1q, self.w2q = init(q_heads, head_dim, hidden), init(q_heads, hidden, rank)
        self.w1k, self.w2k = init(kv_heads, head_dim, hidden), init(kv_heads, hidden, rank)
        self.w3 = init(kv_heads, rank, rank)
        self.d = nn.Parameter(torch.full((kv_heads, 1, rank), 1e-4))
        self.d2 = nn.Parameter(torch.full((kv_heads, 1, rank), 1e-4))
        self.dropout = nn.Dropout(dropout)

    def phi(self, query: torch.Tensor) -> torch.Tensor:
        """Query features ``[batch, q_heads, n, rank]`` from ``[batch, q_heads, n, head_dim]``."""
        hidden = self.dropout(F.gelu(query @ self.w1q))  # [b, h, n, d] @ [h, d, m]: per-head matmul
        return F.gelu(hidden @ self.w2q).abs()

    def psi(self, keys: torch.Tensor) -> torch.Tensor:
        """Key features ``[batch, kv_heads, n, rank]`` from ``[batch, kv_heads, n, head_dim]``."""
        hidden = self.dropout(F.gelu(keys @ self.w1k))
        u = self.d.abs() * F.gelu(hidden @ self.w2k)
        return (u + (u @ self.w3) * self.d2).abs()
