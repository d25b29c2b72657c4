"""CurDKV (Sengupta et al. 2025, "Value-Guided KV Compression for LLMs via Approximated CUR
Decomposition", arXiv 2509.15038; kvpress's ``CURPress``).

CUR decomposition keeps the rows of highest leverage; CurDKV approximates a token's leverage by its
squared norms: ``k2 = ||k||^2`` and ``v2 = ||v||^2`` per KV head, each normalised within local blocks
of ``local_window_size`` tokens (from token 0; the last block may be shorter), and scores
``k2 * v2`` (kvpress's default ``kv_product``; ``key``, ``value`` and ``kv_avg`` also offered). The
first ``num_sinks`` tokens are kept (kvpress sets their scores to 1). As kvpress: query-agnostic,
prompt only, no random projection (kvpress's ``use_random_leverage`` defaults to False). RoPE is a
rotation, so the post-RoPE key norm is the pre-RoPE one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.checks import option
from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer

#: ``leverage_type`` -> the score from the normalised ``(k2, v2)``.
COMBINE = {
    "key": lambda k2, v2: k2,
    "value": lambda k2, v2: v2,
    "kv_avg": lambda k2, v2: (k2 + v2) / 2,
    "kv_product": lambda k2, v2: k2 * v2,
}


def block_normalised(x: torch.Tensor, window: int) -> torch.Tensor:
    """``x`` ``[batch, kv_heads, n]`` divided by its sum over each block of ``window`` tokens (from 0)."""
    n = x.shape[-1]
    blocks = F.pad(x, (0, -n % window)).unflatten(-1, (-1, window))
    return (blocks / blocks.sum(-1, keepdim=True)).flatten(-2)[..., :n]


@dataclass
class CurDKV(ScoreEvict):
    """CurDKV's approximate leverage scores (module docstring), per KV head, at prefill.

    Parameters
    ----------
    num_sinks : int
        First tokens always kept (attention sinks).
    leverage_type : str
        ``kv_product`` (default), ``kv_avg``, ``key`` or ``value``.
    local_window_size : int
        Tokens per normalisation block (kvpress: 16); 0 normalises over the whole prompt.

    Raises
    ------
    ValueError
        For an unknown ``leverage_type``, or a negative ``num_sinks`` or ``local_window_size``.
    """

    name: ClassVar[str] = "cur"
    TRAITS: ClassVar[Traits] = replace(
        ScoreEvict.TRAITS, prompt_only=True, decode_rule=False, decode_input="none"
    )

    num_sinks: int = option(4, low=0, high="max_context")
    leverage_type: str = "kv_product"
    local_window_size: int = option(16, low=0, high="max_context")

    def __post_init__(self) -> None:
        if self.leverage_type not in COMBINE:
            raise ValueError(f"leverage_type must be one of {sorted(COMBINE)}, got {self.leverage_type!r}")
        if self.num_sinks < 0 or self.local_window_size < 0:
            raise ValueError("num_sinks and local_window_size must be >= 0")

    def protected(self, bound: int) -> tuple[int, int]:
        """The ``num_sinks`` first tokens (at most the bound)."""
        return min(self.num_sinks, bound), 0

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """``[batch, kv_heads, prompt]`` scores of every prompt token."""
        k2, v2 = (x.float().square().sum(-1) for x in (layer.keys, layer.values))
        if self.local_window_size:
            k2, v2 = (block_normalised(x, self.local_window_size) for x in (k2, v2))
        return COMBINE[self.leverage_type](k2, v2)
