"""H2O: Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023; FMInference/H2O real-drop code).

Per KV head the cache keeps the ``recent`` latest tokens plus the ``heavy`` tokens with the
highest accumulated attention ("heavy hitters"). The accumulated score of a token is the sum of
the attention it received from every query while it was in the cache: at prefill the column sums
of the causal prompt attention (computed in chunks), then one row per decode step. Once over
budget, the lowest-scoring non-recent token is evicted at every step (docs/methods.md, "H2O").
A score-then-evict rule (``methods.evict``): protected = the recent window, score = accumulated
attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.checks import check_range
from methods.evict import ScoreEvict
from methods.scoring import causal_column_sums
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan


@dataclass
class H2O(ScoreEvict):
    """H2O with heavy and recent budgets splitting the budget equally (the paper's default).

    Parameters
    ----------
    heavy_ratio : float
        Share of the budget for heavy hitters (0.5).
    recent_ratio : float
        Share of the budget for the recent window (0.5); the two shares sum to at most 1, and
        when they sum to 1 the heavy hitters get any slot lost to rounding.
    chunk_size : int
        Query rows per chunk of the prefill column sums (memory only, not results).
    state_rank : int
        "H2O Baseline+" of the LESS paper: extra slots per head worth the bytes of a LESS state of
        this rank (``H`` ``[R, head_dim]`` + ``z`` ``[R]`` in float32, rounded up to whole slots);
        0 (default) for plain H2O.

    Raises
    ------
    ValueError
        For shares outside ``[0, 1]`` or summing above 1, or a budget with no heavy-hitter slot.
    """

    name: ClassVar[str] = "h2o"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, score_decay=1.0)  # s <- s + a, fused

    heavy_ratio: float = 0.5
    recent_ratio: float = 0.5
    chunk_size: int = 256
    state_rank: int = 0

    def __post_init__(self) -> None:
        check_range(self, "heavy_ratio", "recent_ratio")
        if self.heavy_ratio + self.recent_ratio > 1.0 + 1e-9:
            raise ValueError(
                f"heavy_ratio + recent_ratio must be <= 1, got {self.heavy_ratio + self.recent_ratio}"
            )
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")

    def split(self, budget: int) -> tuple[int, int]:
        """``(heavy, recent)`` slots for a budget.

        Raises
        ------
        ValueError
            If no heavy-hitter slot remains.
        """
        recent = int(self.recent_ratio * budget)
        whole = math.isclose(self.heavy_ratio + self.recent_ratio, 1.0)
        heavy = budget - recent if whole else int(self.heavy_ratio * budget)
        if heavy < 1:
            raise ValueError(f"H2O budget of {budget} slots leaves no heavy-hitter slot (recent={recent})")
        return heavy, recent

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The layer's budget plus the Baseline+ slots of ``state_rank`` (tokens): what H2O holds,
        and what the layer sizes its buffers from (``CompressionMethod.plan``)."""
        plan = super().plan(layer)
        if plan.keep is None or not self.state_rank:
            return plan
        d_k, d_v = layer.keys.shape[-1], layer.values.shape[-1]
        state = (self.state_rank * d_v + self.state_rank) * 4
        keep = plan.keep + math.ceil(state / ((d_k + d_v) * layer.keys.element_size()))
        first, recent = self.protected(keep)
        bound = None if plan.bound is None else keep
        return replace(plan, bound=bound, keep=keep, first=first, recent=recent)

    def protected(self, bound: int) -> tuple[int, int]:
        """No first tokens; the recent window of :meth:`split`."""
        return 0, self.split(bound)[1]

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """Accumulated attention of every prompt token: causal column sums (H2O Sec. 3)."""
        return causal_column_sums(query, layer.keys, scaling, self.chunk_size, softcap=layer.spec.softcap)

    def step_scores(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor | None:
        """Accumulated attention plus this step's probabilities ``[batch, kv_heads, slots]``; None
        when the decode attention already added them (``probs`` None: ``score_decay``)."""
        return None if probs is None else layer.store.state["scores"] + probs
