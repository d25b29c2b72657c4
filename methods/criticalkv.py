"""CriticalKV (Feng et al. 2025, "Identify Critical KV Cache in LLM Inference from an Output
Perturbation Perspective"; kvpress's ``CriticalKVPress``).

A wrapper over a score-then-evict scorer. The output perturbation of dropping a token is bounded by
its attention weight times ``||v W_o||_1``, the L1 norm of its value through the layer's output
projection, so selection runs in two stages: stage 1 keeps the ``first_stage_ratio`` share of the
budget with the highest scores of the wrapped scorer; stage 2 fills the rest by
``(score + epsilon) * ||v W_o||_1`` (kvpress: per query head with that head's slice of ``o_proj``,
averaged over the query heads of a KV group), the scorer's scores taken on kvpress's scale
(``ScoreEvict.score_scale``: SnapKV's votes averaged over its window, not summed) so that ``epsilon``
means what it means there. The scorer's protected tokens count toward stage 1,
as in kvpress, where they carry the highest score. While decoding (a scorer that holds its budget
then) the same two-stage rule picks the one token to evict per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import ClassVar

import torch

from methods.checks import check_range
from methods.evict import ScoreEvict
from methods.scoring import keep_index, lowest_score
from methods.seam.architecture import UnsupportedArchitectureError
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.snapkv import SnapKV
from methods.wrap import ScorerWrapper

#: The score stage 1 (and the scorer's protected tokens) get in the two-stage scores (kvpress).
KEPT = torch.finfo(torch.float32).max


def output_norm(
    values: torch.Tensor, out_proj: torch.Tensor, chunk: int = 1 << 26, ord: int = 1, per_head: bool = False
) -> torch.Tensor:
    """``||v W_o^h||`` (``ord`` 1: L1, CriticalKV; 2: L2, KVzip+) of ``values`` ``[batch, kv_heads,
    slots, head_dim]`` through each query head ``h``'s slice of ``out_proj`` (``o_proj.weight``
    ``[hidden, q_heads * head_dim]``): float32 ``[batch, kv_heads, slots]`` averaged over the query heads
    of each KV group, or ``[batch, kv_heads, group, slots]`` (``per_head``). Tokens go in chunks of at
    most ``chunk`` projected elements (memory only)."""
    b, kv, n, d = values.shape
    weight = out_proj.to(values.dtype).view(out_proj.shape[0], kv, -1, d)  # [hidden, kv, group, d]
    step = max(1, chunk // (b * weight.shape[0] * weight.shape[1] * weight.shape[2]))
    parts = []
    for start in range(0, n, step):
        projected = torch.einsum("bhnd,ohgd->bhgno", values[:, :, start : start + step], weight)
        norm = torch.linalg.vector_norm(projected, ord=ord, dim=-1, dtype=torch.float32)
        parts.append(norm if per_head else norm.mean(dim=2))
    return torch.cat(parts, dim=-1)


def two_stage(
    scores: torch.Tensor, norms: torch.Tensor, candidates: torch.Tensor, first_stage: int, epsilon: float
) -> torch.Tensor:
    """CriticalKV's scores ``[batch, kv_heads, slots]``: :data:`KEPT` for the ``first_stage``
    candidates with the highest ``scores`` and for every non-candidate (protected) slot,
    ``(scores + epsilon) * norms`` for the other candidates (``candidates``: bool, same shape)."""
    critical = torch.where(candidates, (scores + epsilon) * norms, KEPT)
    if first_stage > 0:
        top = torch.where(candidates, scores, -torch.inf).topk(first_stage, dim=-1).indices
        critical = critical.scatter(-1, top, KEPT)
    return critical


@dataclass
class CriticalKV(ScorerWrapper):
    """CriticalKV over a scorer (default SnapKV): the scorer's plan, protected tokens and scores,
    re-ranked in two stages by the output projection's value norms.

    Parameters
    ----------
    scorer : ScoreEvict
        The wrapped score-then-evict method (with a ``scores`` field); its decode inputs,
        attention and plan are CriticalKV's.
    first_stage_ratio : float
        Share of the budget kept by the scorer's scores alone (kvpress: 0.5).
    epsilon : float
        Added to the scores before the rescaling (kvpress: 1e-4).

    Raises
    ------
    ValueError
        For a scorer that is not a score-then-evict method with scores, a ratio outside ``[0, 1]``
        or a negative epsilon.
    """

    name: ClassVar[str] = "criticalkv"

    scorer: ScoreEvict = field(default_factory=SnapKV)
    first_stage_ratio: float = 0.5
    epsilon: float = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        if "scores" not in self.scorer.traits.state_fill:
            raise ValueError(f"scorer must be a score-then-evict method with scores, got {self.scorer!r}")
        check_range(self, "first_stage_ratio")
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")

    # the wrapper (``methods.wrap``) forwards the rest to the scorer; selection is this class's
    prefill = ScoreEvict.prefill
    decode_step = ScoreEvict.decode_step

    @cached_property
    def traits(self) -> Traits:
        """The scorer's traits; its state plus ``vnorm``, each slot's ``||v W_o||_1``."""
        scorer = self.scorer.traits
        return replace(scorer, state_fill={**scorer.state_fill, "vnorm": 0.0})

    # ------------------------------------------------------------------ scoring
    def first_stage(self, plan: LayerPlan, bound: int) -> int:
        """Candidates kept by stage 1 under ``bound`` slots: ``int(ratio * bound)`` less the
        protected tokens (they fill stage 1 first, kvpress)."""
        return max(0, int(self.first_stage_ratio * bound) - plan.first - plan.recent)

    def norms(self, layer: CompressedLayer, values: torch.Tensor) -> torch.Tensor:
        """:func:`output_norm` with the layer's ``o_proj`` (``layer.spec.out_proj``).

        Raises
        ------
        UnsupportedArchitectureError
            When the model's attention has no ``o_proj`` the seam could find.
        """
        if layer.spec.out_proj is None:
            raise UnsupportedArchitectureError("criticalkv needs the attention's output projection (o_proj)")
        return output_norm(values, layer.spec.out_proj)

    def critical(self, layer: CompressedLayer, scores: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
        """Two-stage scores of the prompt (:func:`two_stage`) under ``plan.keep``."""
        plan, pos = layer.plan, layer.store.positions
        candidates = (pos >= plan.first) & (pos < layer.store.n_slots - plan.recent)
        first = min(self.first_stage(plan, plan.keep), layer.store.n_slots - plan.first - plan.recent)
        return two_stage(scores * self.scorer.score_scale(layer), norms, candidates, first, self.epsilon)

    def prefill_scores(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """Two-stage scores ``[batch, kv_heads, prompt]`` of every prompt token (protected and stage-1
        tokens: :data:`KEPT`); None when the scorer gives none or there is no budget."""
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is None or layer.plan.keep is None:
            return None
        return self.critical(layer, scores, self.norms(layer, layer.values))

    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """Keep the protected tokens and the top two-stage scores; the scorer's scores and the value
        norms stay in the state for decoding."""
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is not None:
            layer.store.write("scores", scores)
        plan = layer.plan
        if plan.keep is None:
            return None
        norms = self.norms(layer, layer.values)
        layer.store.write("vnorm", norms)
        if layer.store.n_slots <= plan.keep:
            return None
        critical = self.critical(layer, layer.store.state["scores"], norms)
        return keep_index(critical, plan.first, plan.keep - plan.first - plan.recent, plan.recent)

    def decode_victim(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor | None:
        """The scorer updates its scores; the new token's value norm is stored; once over the bound
        the candidate with the lowest two-stage score is evicted."""
        scores = self.scorer.step_scores(layer, probs)
        if scores is not None:
            layer.store.write("scores", scores)
        plan, n = layer.plan, layer.store.n_slots
        if plan.bound is None:
            return None
        newest = torch.full((*layer.store.positions.shape[:2], 1), n - 1, device=layer.keys.device)
        layer.store.replace(newest, vnorm=self.norms(layer, layer.values[:, :, n - 1 :]))
        if n <= plan.bound:
            return None
        pos = layer.store.positions
        candidates = (pos >= plan.first) & (pos <= layer.tokens_seen() - 1 - plan.recent)
        critical = two_stage(
            layer.store.state["scores"] * self.scorer.score_scale(layer),
            layer.store.state["vnorm"],
            candidates,
            self.first_stage(plan, plan.bound),
            self.epsilon,
        )
        return lowest_score(critical, candidates)
