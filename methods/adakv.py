"""AdaKV (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation"):
head-adaptive budgets, freed for real.

Algorithm 1: a layer's budget is ``heads x B``; instead of the top ``B`` of each head, the layer keeps
the top ``heads x B`` scores across all its heads, so heads whose attention is concentrated give slots
to heads whose attention is spread. A safeguard (Sec. 4.3, kvpress's ``alpha_safeguard``) first
reserves each head's top ``alpha x B`` tokens; the scorer's protected tokens (SnapKV's observation
window) are kept in every head. Allocation happens once, at prefill (the paper and kvpress): every
head then holds its own slot count in packed buffers (``methods.seam.ragged``) and decoding appends
to every head. kvpress simulates this by masking (no memory saved); here the layer holds exactly the
sum of its heads' slots.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.checks import check_range
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.wrap import ScorerWrapper


def adakv_keep(
    scores: torch.Tensor, keep: int, first: int, recent: int, alpha: float, safe_protected: bool = False
) -> torch.Tensor:
    """AdaKV's selection: which tokens each head keeps.

    Parameters
    ----------
    scores : torch.Tensor
        ``[batch, kv_heads, prompt]`` scorer scores (higher: keep).
    keep : int
        Slots per head of a uniform layer ``B``; the layer keeps ``kv_heads x B``.
    first, recent : int
        Protected tokens kept by every head (attention sinks, observation window).
    alpha : float
        Safeguard: each head first reserves its top ``floor(alpha x B)`` unprotected tokens.
    safe_protected : bool
        kvpress's safeguard instead: ``max(1, floor(alpha x B))`` tokens (``alpha > 0``) of which the
        protected ones are spent first (its SnapKV gives them the maximal score), so only the rest
        go to unprotected tokens.

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, prompt]`` bool, ``kv_heads x B`` true per batch row.
    """
    b, h, n = scores.shape
    pos = torch.arange(n, device=scores.device)
    protected = (pos < first) | (pos >= n - recent)
    s = scores.float().masked_fill(protected, float("-inf"))
    top = torch.finfo(torch.float32).max
    safe = min(int(keep * alpha), keep - first - recent)
    if safe_protected:
        safe = max(0, (max(1, int(keep * alpha)) if alpha > 0 else 0) - first - recent)
    if safe > 0:
        s = s.scatter(-1, s.topk(safe, dim=-1).indices, top)
    s = s.masked_fill(protected, top)
    chosen = s.reshape(b, h * n).topk(h * keep, dim=-1).indices
    mask = torch.zeros(b, h * n, dtype=torch.bool, device=scores.device)
    return mask.scatter_(1, chosen, True).view(b, h, n)


@dataclass
class AdaKV(ScorerWrapper):
    """AdaKV over a scorer (SnapKV in the paper; any score-then-evict scorer here).

    Parameters
    ----------
    scorer : ScoreEvict
        Scores every prompt token of every head (compared across the heads of a layer).
    alpha_safeguard : float
        Fraction of the uniform per-head budget each head is guaranteed (paper, kvpress: 0.2).
    safeguard_protected : bool
        Count the protected tokens (observation window, sinks) in the safeguard, as kvpress does
        (:func:`adakv_keep`'s ``safe_protected``; preset ``adakv_snapkv_kvpress``); False (the
        paper's reading): the safeguard reserves unprotected tokens besides them.

    Raises
    ------
    ValueError
        For ``alpha_safeguard`` outside ``[0, 1]`` or a scorer that ranks no tokens.
    """

    name: ClassVar[str] = "adakv"

    alpha_safeguard: float = 0.2
    safeguard_protected: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range(self, "alpha_safeguard")

    #: allocation is done once, at prefill; decoding appends to every head (the paper)
    OVERRIDES: ClassVar[dict] = {
        "prompt_only": True,
        "decode_rule": False,
        "decode_input": "none",
        "ragged_heads": True,
    }

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The scorer's plan with no decode bound."""
        return replace(self.scorer.plan(layer), bound=None)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Score the prompt; keep the top ``heads x B`` across heads (:func:`adakv_keep`) in ragged heads."""
        plan = layer.plan
        if plan.fits(layer.store.n_slots):
            return
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is None:  # the scorer ranks by position: every head keeps the same tokens
            self.scorer.prefill(layer, query, scaling)
            return
        keep = adakv_keep(
            scores, plan.keep, plan.first, plan.recent, self.alpha_safeguard, self.safeguard_protected
        )
        layer.store = layer.store.ragged(keep)
        layer.aux.clear()  # the scorer's decode-time state (Expected Attention's query statistics)

    #: the store's attention (over ragged heads after an allocation), not the scorer's: AdaKV
    #: allocates once
    decode_attention = CompressionMethod.decode_attention
