"""KNorm (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression").

Keys with a low L2 norm draw high attention (Sec. 3), so the cache keeps the tokens with the lowest
key norm: score = -||k|| (kvpress's ``KnormPress``). Attention-free: decoding uses fused attention.
A score-then-evict rule (``methods.evict``): nothing protected (neither the paper nor kvpress
protects tokens), at prefill and at every decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer


@dataclass
class KNorm(ScoreEvict):
    """KNorm: per KV head, keep the tokens whose (post-RoPE) keys have the lowest L2 norm.

    RoPE is a rotation, so the norm is that of the pre-RoPE key. Scores ``[batch, kv_heads, slots]``
    are recomputed from ``layer.keys`` ``[batch, kv_heads, slots, head_dim]`` at every step.
    """

    name: ClassVar[str] = "knorm"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, decode_input="none")

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """``-||k||`` of every prompt token."""
        return -layer.keys.float().norm(dim=-1)

    def step_scores(self, layer: CompressedLayer, probs: None) -> torch.Tensor:
        """``-||k||`` of every slot (the new one included)."""
        return -layer.keys.float().norm(dim=-1)
