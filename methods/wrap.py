"""Budget allocators that compose with any scorer (:class:`ScorerWrapper`).

An allocator decides *how many* slots each layer or KV head keeps; the wrapped scorer (any
score-then-evict method, ``methods.evict.ScoreEvict``: SnapKV, TOVA, KNorm, ...) decides
*which*. The wrapper is the scorer in every respect (its state, decode input, protected tokens,
scores, prefill and decode steps) except the part the allocator overrides: the layer's plan
(PyramidKV, per-layer ratios) or the prefill selection (AdaKV's top-k across heads). Records name
it ``<allocator>_<scorer>`` (``adakv_snapkv``, kvpress's names).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.seam.contract import AssetRequest, CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan


@dataclass
class ScorerWrapper(ScoreEvict):
    """A score-then-evict scorer under an allocator (module docstring). Its traits are the scorer's
    with the allocator's ``OVERRIDES``; its ``decode_budget``, when set, is the scorer's.

    Parameters
    ----------
    scorer : ScoreEvict
        The wrapped scorer (a nested ``_target_`` in the method config).

    Raises
    ------
    ValueError
        If ``scorer`` is not a score-then-evict method (it ranks no tokens).
    """

    name: ClassVar[str] = "wrapper"
    #: What the allocator changes of the scorer's :class:`~methods.seam.contract.Traits`.
    OVERRIDES: ClassVar[dict] = {}
    #: The scorer of the allocator's paper: with it, records name the wrapper by its own name alone.
    PAPER_SCORER: ClassVar[str | None] = None

    scorer: ScoreEvict

    def __post_init__(self) -> None:
        if not isinstance(self.scorer, ScoreEvict):
            raise ValueError(
                f"{self.name} needs a score-then-evict scorer (snapkv, tova, knorm, ...), "
                f"got {type(self.scorer).__name__}"
            )
        if self.decode_budget is not None:  # one switch: the scorer decodes as the wrapper is told
            self.scorer = replace(self.scorer, decode_budget=self.decode_budget)

    @cached_property
    def traits(self) -> Traits:
        """The scorer's traits with :attr:`OVERRIDES`."""
        return replace(self.scorer.traits, **self.OVERRIDES)

    def paper(self) -> ScorerWrapper:
        """The wrapper and its scorer under their papers' decoding rules."""
        return replace(self, scorer=self.scorer.paper(), decode_budget=None)

    @property
    def label(self) -> str:
        """``<allocator>_<scorer>`` (``adakv_snapkv``); ``<allocator>`` with :attr:`PAPER_SCORER`."""
        return self.name if self.scorer.label == self.PAPER_SCORER else f"{self.name}_{self.scorer.label}"

    # ------------------------------------------------------------------ the scorer's rule
    def protected(self, bound: int) -> tuple[int, int]:
        return self.scorer.protected(bound)

    def prefill_scores(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        return self.scorer.prefill_scores(layer, query, scaling)

    def step_scores(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor | None:
        return self.scorer.step_scores(layer, probs)

    def ranking(self, layer: CompressedLayer) -> torch.Tensor:
        return self.scorer.ranking(layer)

    def score_scale(self, layer: CompressedLayer) -> float:
        return self.scorer.score_scale(layer)

    def check_budget(self, budget: int, tokens: int) -> None:
        self.scorer.check_budget(budget, tokens)

    def attach_assets(self, request: AssetRequest) -> None:
        self.scorer.attach_assets(request)

    def check_model(self, config) -> None:
        super().check_model(config)
        self.scorer.check_model(config)

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        return self.scorer.plan(layer)

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.scorer.decode_attention(layer, query, scaling)

    def prepare_graph_step(self, layer: CompressedLayer, k: int) -> None:
        self.scorer.prepare_graph_step(layer, k)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        self.scorer.prefill(layer, query, scaling)

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        self.scorer.decode_step(layer, probs)


@dataclass
class LayerBudgets(ScorerWrapper):
    """An allocator that gives each layer its own budget (the same for every head of the layer);
    subclasses define :meth:`layer_budget`. The scorer then plans and compresses the layer as if
    the run's budget were that layer's."""

    name: ClassVar[str] = "layer_budgets"

    def layer_budget(self, layer: CompressedLayer, budget: int) -> int:
        """Slots per KV head of ``layer`` for a run budget of ``budget`` slots (``layer.store.n_slots``:
        the prompt's length)."""
        raise NotImplementedError

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The scorer's plan under this layer's budget (:meth:`layer_budget`)."""
        if layer.budget is not None and self.traits.compresses:
            layer.budget = self.layer_budget(layer, layer.budget)
        return self.scorer.plan(layer)


@dataclass
class SubsetWrapper(ScorerWrapper):
    """A wrapper that runs its scorer on subsets of the prompt (kvpress's ``BlockPress``,
    ``ChunkPress``: ``methods.subset``), once at prefill; decoding appends. Nothing is protected over
    the whole prompt: the scorer protects its tokens within each subset."""

    name: ClassVar[str] = "subset"
    OVERRIDES: ClassVar[dict] = {"prompt_only": True, "decode_rule": False, "decode_input": "none"}

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The budget, nothing protected, no bound on decoding."""
        return replace(CompressionMethod.plan(self, layer), bound=None)

    # its own selection at prefill (``prefill_keep``), not the scorer's; decoding attends as any method
    prefill = ScoreEvict.prefill
    decode_attention = CompressionMethod.decode_attention


def spread_evenly(values: list[float]) -> list[int]:
    """Integers whose running sums are the rounded running sums of ``values`` (each within 1 of its
    value; the total is the rounded total): a schedule's layer budgets that add up exactly."""
    out, total, given = [], 0.0, 0
    for v in values:
        total += v
        out.append(round(total) - given)
        given += out[-1]
    return out
