"""The score-then-evict base (:class:`ScoreEvict`): keep protected tokens plus the top-scored rest.

H2O, SnapKV, StreamingLLM, LESS's sparse policies and KeepKV's selection are each a scoring rule
and a protected set on top of this class:

- **Protected**: the first ``first`` tokens (attention sinks) and the ``recent`` most recent
  tokens (recent / observation window) under a bound of ``bound`` slots (:meth:`ScoreEvict.protected`,
  kept in the layer's plan: ``layer.plan.first``, ``layer.plan.recent``).
- **Scores**: ``[batch, kv_heads, slots]`` per-slot scores in the state field ``scores``
  (:meth:`ScoreEvict.prefill_scores` at prefill, :meth:`ScoreEvict.step_scores` after each decode
  step); a method without a ``scores`` field ranks by position (oldest first).
- **Prefill**: over ``layer.plan.keep``, keep the protected tokens and the ``keep - first - recent``
  highest scores between them (:func:`methods.scoring.keep_index`).
- **Decode step**: over ``layer.plan.bound`` (one slot over, right after the append), evict the lowest-scored
  unprotected token (:func:`methods.scoring.lowest_score`): one ``[batch, kv_heads]`` victim, the
  same shapes at every step, no host synchronisation.

:meth:`ScoreEvict.prefill_keep` and :meth:`ScoreEvict.decode_victim` return the selection without
applying it, so that a method can compose a policy (LESS absorbs what its policy evicts; KeepKV
merges it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.scoring import keep_index, lowest_score
from methods.seam.contract import CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan


@dataclass
class ScoreEvict(CompressionMethod):
    """Base of the score-then-evict methods (module docstring). Subclasses override
    :meth:`protected` and the two scoring hooks; ``Traits.state_fill`` declares ``scores`` when they
    score.
    """

    name: ClassVar[str] = "score_evict"
    TRAITS: ClassVar[Traits] = Traits(state_fill={"scores": 0.0}, uses_log_weight=False)

    def protected(self, bound: int) -> tuple[int, int]:
        """``(first, recent)``: tokens always kept under ``bound`` slots (default: none)."""
        return 0, 0

    def prefill_scores(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """Scores ``[batch, kv_heads, prompt]`` of the prompt's tokens, or None (keep the fill value).

        ``query`` is ``[batch, q_heads, prompt, head_dim]`` post-RoPE; ``scaling`` the softmax scale.
        """
        return None

    def step_scores(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor | None:
        """Scores ``[batch, kv_heads, slots]`` after a decode step whose attention gave ``probs``
        (see ``Traits.decode_input``), or None (unchanged)."""
        return None

    def score_scale(self, layer: CompressedLayer) -> float:
        """The factor that puts this scorer's scores on kvpress's scale, where a wrapper adds a constant
        to them (CriticalKV's ``epsilon``): 1 unless the scorer sums what kvpress averages."""
        return 1.0

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The contract's plan (``CompressionMethod.plan``) with the protected tokens of
        :meth:`protected` under the prefill bound ``keep``."""
        plan = super().plan(layer)
        if plan.keep is None:
            return plan
        first, recent = self.protected(plan.keep)
        return replace(plan, first=first, recent=recent)

    def ranking(self, layer: CompressedLayer) -> torch.Tensor:
        """What eviction ranks by: the ``scores`` field, or the positions (oldest evicted first)."""
        return layer.store.state["scores"] if "scores" in self.traits.state_fill else layer.store.positions

    # ------------------------------------------------------------------ selection
    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """Score the prompt; the slots to keep ``[batch, kv_heads, bound]`` (ascending), or None
        when the prompt fits."""
        scores = self.prefill_scores(layer, query, scaling)
        if scores is not None:
            layer.store.write("scores", scores)
        plan = layer.plan
        if plan.fits(layer.store.n_slots):
            return None
        return keep_index(self.ranking(layer), plan.first, plan.keep - plan.first - plan.recent, plan.recent)

    def decode_victim(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor | None:
        """Update the scores; the slot to evict per head ``[batch, kv_heads]``, or None under the bound.

        Candidates are the tokens at positions ``first .. seen - 1 - recent`` (merged slots, with
        position -1, are never candidates)."""
        scores = self.step_scores(layer, probs)
        if scores is not None:
            layer.store.write("scores", scores)
        plan = layer.plan
        if plan.bound is None or layer.store.n_slots <= plan.bound:
            return None
        pos = layer.store.positions
        candidates = (pos >= plan.first) & (pos <= layer.tokens_seen() - 1 - plan.recent)
        return lowest_score(self.ranking(layer), candidates)

    # ------------------------------------------------------------------ hooks
    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Keep the protected and top-scored prompt tokens (:meth:`prefill_keep`)."""
        index = self.prefill_keep(layer, query, scaling)
        if index is not None:
            layer.store.keep(index)

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Evict the lowest-scored unprotected token once over the bound (:meth:`decode_victim`)."""
        victim = self.decode_victim(layer, probs)
        if victim is not None:
            layer.store.drop(victim)
