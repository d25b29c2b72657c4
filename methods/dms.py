"""DMS-style threshold eviction (kvpress's ``DMSPress``, after Łańcucki et al. 2025, "Inference-Time
Hyper-Scaling with KV Cache Compression", arXiv 2506.05345): evict what a scorer rates below a
threshold instead of keeping a top-k.

A wrapper over any score-then-evict scorer with scores (``methods.wrap``). As ``dms_press.py`` (dense
prefill, no trained evictor): the newest ``sliding_window_size`` tokens are protected, and every older
token whose score is below ``threshold`` is evicted, in each KV head on its own. The kept fraction is
an outcome (``Traits.budget_applies`` False: records carry no budget and the realised
``prefill_kept_fraction``, as KVMerger at a fixed ``theta``). Heads that keep different counts are
packed (``methods.seam.ragged``), so the memory is freed (kvpress masks). The scorer plans as under a
budget of the sliding window, and its own protected tokens are kept too (kvpress gives them the maximal
score: SnapKV's observation window). Once, at prefill: kvpress's ``decoding=True`` is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from methods.adakv import AdaKV
from methods.checks import option
from methods.evict import ScoreEvict
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.snapkv import SnapKV
from methods.wrap import ScorerWrapper


@dataclass
class DMS(ScorerWrapper):
    """Threshold eviction over a scorer.

    Parameters
    ----------
    scorer : ScoreEvict
        A score-then-evict method with scores (higher: keep); SnapKV as kvpress runs it by default.
    threshold : float
        Tokens scored below it are evicted, on kvpress's scale of the scorer (``score_scale``: SnapKV's
        votes averaged over the window). 0.001 keeps about half on XSum with SmolLM2-135M.
    sliding_window_size : int
        Newest tokens never evicted (kvpress: 128).

    Raises
    ------
    ValueError
        For a scorer without scores, a window < 1, or a threshold <= 0 over SnapKV (whose scores are
        attention probabilities: every token kept).
    """

    name: ClassVar[str] = "dms"
    #: once, at prefill, as AdaKV's allocation; the kept fraction is an outcome
    OVERRIDES: ClassVar[dict] = {**AdaKV.OVERRIDES, "budget_applies": False}

    scorer: ScoreEvict = field(default_factory=lambda: SnapKV(window_size=64, kernel_size=5, pooling="avg"))
    threshold: float = 0.001
    sliding_window_size: int = option(128, low=1, high="max_context")

    def __post_init__(self) -> None:
        super().__post_init__()
        if "scores" not in self.scorer.traits.state_fill:
            raise ValueError(f"dms needs a scorer with scores (snapkv, knorm, ...), got {self.scorer.label}")
        if self.sliding_window_size < 1:
            raise ValueError(f"sliding_window_size must be >= 1, got {self.sliding_window_size}")
        if isinstance(self.scorer, SnapKV) and self.threshold <= 0:
            raise ValueError(
                f"threshold={self.threshold} keeps every token (SnapKV's averaged votes are >= 0): that is "
                "FullKV under the DMS label; use a threshold > 0 (kvpress: 0.001 keeps about half)"
            )

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The scorer's plan under a budget of the sliding window (its protected tokens), no bound."""
        budget, layer.budget = layer.budget, min(self.sliding_window_size, layer.store.n_slots)
        plan = self.scorer.plan(layer)
        layer.budget = budget
        return replace(plan, bound=None)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Evict, per head, the unprotected tokens scored below ``threshold``; the same count in every
        head keeps the uniform store, different counts pack the heads."""
        plan, n = layer.plan, layer.store.n_slots
        if n <= self.sliding_window_size:
            return
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is None:
            return
        pos = torch.arange(n, device=scores.device)
        protected = (pos < plan.first) | (pos >= n - max(plan.recent, self.sliding_window_size))
        keep = protected | (scores * self.scorer.score_scale(layer) >= self.threshold)
        counts = keep.sum(-1)
        if bool((counts == n).all()):
            return
        if bool((counts == counts.amin()).all()):
            layer.store.keep((~keep).to(torch.uint8).argsort(dim=-1, stable=True)[..., : int(counts.amin())])
        else:
            layer.store = layer.store.ragged(keep)
            layer.aux.clear()  # the scorer's decode-time state (Expected Attention's query statistics)

    decode_attention = CompressionMethod.decode_attention
