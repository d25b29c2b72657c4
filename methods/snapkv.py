"""SnapKV (Li et al., NeurIPS 2024; FasterDecoding/SnapKV): one-shot prompt compression.

At the end of prefill, the last ``window_size`` prompt queries (the observation window) vote for
prefix tokens; the votes are smoothed by 1-D pooling and the top ``budget - window`` prefix
tokens per KV head are kept together with the window itself (docs/methods.md section 4). Decoded
tokens are appended uncompressed, as in the paper, unless ``decode_budget`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from methods.base import CompressionMethod
from methods.layer import CompressedLayer
from methods.scoring import lowest_score, pool_scores, top_and_recent, window_attention

POOLINGS = ("max", "avg")


@dataclass
class SnapKV(CompressionMethod):
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
    decode_budget : bool
        Also cap the cache while decoding: votes keep accumulating each step's attention and the
        lowest-voted token outside the window is evicted (not in the paper).

    Raises
    ------
    ValueError
        For a window < 1, an even kernel or an unknown pooling.
    """

    name: ClassVar[str] = "snapkv"
    state_fill: ClassVar[dict[str, float]] = {"scores": 0.0}
    uses_log_weight: ClassVar[bool] = False

    window_size: int = 32
    kernel_size: int = 7
    pooling: str = "max"
    decode_budget: bool = False

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and >= 1, got {self.kernel_size}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")

    @property
    def decode_input(self) -> str:
        """``probs`` with ``decode_budget`` (votes keep accumulating), else ``none``."""
        return "probs" if self.decode_budget else "none"

    @property
    def budget_holds_in_decode(self) -> bool:
        return self.decode_budget

    def window(self, budget: int) -> int:
        """Observation window (tokens) used with a budget."""
        return self.window_size if budget > self.window_size else max(1, budget // 2)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Vote with the observation window, pool, keep top prefix tokens + the window."""
        length = layer.n_slots
        if layer.budget is None or length <= layer.budget:
            return
        w = self.window(layer.budget)
        votes = window_attention(query, layer.keys, w, scaling, layer.softcap).sum(dim=2)
        prefix = pool_scores(votes[..., : length - w], self.kernel_size, self.pooling)
        layer.state["scores"] = torch.cat([prefix, votes[..., length - w :]], dim=-1)
        layer.gather(top_and_recent(layer.state["scores"], layer.budget - w, w))

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """With ``decode_budget``: accumulate votes, evict the lowest outside the window."""
        if not self.decode_budget or layer.budget is None:
            return
        layer.state["scores"].add_(probs)
        if layer.n_slots > layer.budget:
            outside = layer.positions <= layer.seen_tokens - 1 - self.window(layer.budget)
            layer.drop(lowest_score(layer.state["scores"], outside))
