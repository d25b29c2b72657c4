"""SnapKV (Li et al., NeurIPS 2024; FasterDecoding/SnapKV): one-shot prompt compression.

At the end of prefill, the last ``window_size`` prompt queries (the observation window) vote for
prefix tokens; the votes are smoothed by 1-D pooling and the top ``budget - window`` prefix
tokens per KV head are kept together with the window itself (docs/methods.md, "SnapKV"). Decoded
tokens are appended uncompressed, as in the paper, unless ``decode_budget`` is set. A
score-then-evict rule (``methods.evict``): protected = the observation window, score = pooled votes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.scoring import pool_scores, window_attention
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer

POOLINGS = ("max", "avg")


@dataclass
class SnapKV(ScoreEvict):
    """SnapKV with the paper's LongBench settings (w = 32, k = 7, max pooling).

    Parameters
    ----------
    window_size : int
        Observation window (queries), kept in the cache. A budget at or below it shrinks the
        window to half the budget (the official code requires budget > window).
    kernel_size : int
        Pooling kernel over the prefix votes (odd; 1 disables pooling).
    pooling : str
        ``"max"`` (paper) or ``"avg"`` (library default).
    decode_budget : bool | None
        ``true``: also cap the cache while decoding (votes keep accumulating each step's attention
        and the lowest-voted token outside the window is evicted; not in the paper). Default: the
        paper's rule, the prompt only.

    Raises
    ------
    ValueError
        For a window < 1, an even kernel or an unknown pooling.
    """

    name: ClassVar[str] = "snapkv"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, prompt_only=True)

    window_size: int = 32
    kernel_size: int = 7
    pooling: str = "max"

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and >= 1, got {self.kernel_size}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")

    def window(self, budget: int) -> int:
        """Observation window (tokens) used with a budget: the whole window once the budget holds
        it (a budget of exactly the window keeps the window alone, as kvpress's SnapKV), else half
        the budget."""
        return self.window_size if budget >= self.window_size else max(1, budget // 2)

    def protected(self, bound: int) -> tuple[int, int]:
        """No first tokens; the observation window."""
        return 0, self.window(bound)

    def prefill_scores(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """Votes of the observation window, pooled over the prefix (SnapKV Sec. 4); None when the
        prompt fits the budget (nothing to select)."""
        length, w = layer.store.n_slots, layer.plan.recent
        if layer.plan.fits(length):
            return None
        votes = window_attention(query, layer.keys, w, scaling, layer.spec.softcap).sum(dim=2)
        prefix = pool_scores(votes[..., : length - w], self.kernel_size, self.pooling)
        return torch.cat([prefix, votes[..., length - w :]], dim=-1)

    def score_scale(self, layer: CompressedLayer) -> float:
        """``1 / w``: the votes are summed over the observation window of ``w`` queries (the ranking is
        the same), kvpress's ``SnapKVPress`` averages them (CriticalKV's epsilon is on that scale)."""
        return 1.0 / layer.plan.recent

    def step_scores(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor | None:
        """Votes plus this step's probabilities (``decode_budget=true``)."""
        return layer.store.state["scores"] + probs
