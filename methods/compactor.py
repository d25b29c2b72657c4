"""Compactor (Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
Approximate Leverage Scores", arXiv 2507.08143; kvpress's ``CompactorPress``).

Two query-agnostic views of a token blended: its key's leverage (:class:`methods.leverage_score.
LeverageScore`, the geometry of the pre-RoPE keys) and the attention it receives in non-causal chunked
attention (:func:`methods.non_causal_attn.non_causal_scores`), each z-scored, as
``score = blending * leverage + attention``. The ``sink_size_start`` first and ``sink_size_end`` last
prompt tokens are kept and left out of both scores (centring, chunks, pooling and z-scores run over
the tokens between them), as ``compactor_press.py``. kvpress's default ``blending`` is its compression
ratio; ours (None) is the share of the prompt the budget evicts, ``1 - keep / prompt`` (the ratio up to
kvpress's floor of the kept count). Prompt only (kvpress: prefill only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.checks import check_bounds, option
from methods.evict import ScoreEvict
from methods.leverage_score import LeverageScore, pre_rope_keys
from methods.non_causal_attn import non_causal_scores
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer


@dataclass
class Compactor(ScoreEvict):
    """Compactor: keep the sinks and the tokens of the best blended leverage and non-causal attention.

    Parameters
    ----------
    sink_size_start : int
        First prompt tokens kept and not scored (kvpress: 8).
    sink_size_end : int
        Last prompt tokens kept and not scored (kvpress: 4).
    chunk_size : int
        Tokens per chunk of the non-causal attention (kvpress: 256).
    sketch_dimension : int
        Columns of the leverage's Gaussian sketch (kvpress: 48).
    blending : float | None
        Weight of the leverage score; None: the evicted share ``1 - keep / prompt`` (module docstring).
    seed : int | None
        Seed of the sketch (:class:`~methods.leverage_score.LeverageScore`; None: kvpress's draw from
        torch's global generator).

    Raises
    ------
    ValueError
        For a negative sink count or ``blending``, ``chunk_size`` < 1 or ``sketch_dimension`` < 1.
    """

    name: ClassVar[str] = "compactor"
    TRAITS: ClassVar[Traits] = replace(
        ScoreEvict.TRAITS, prompt_only=True, decode_rule=False, decode_input="none"
    )

    sink_size_start: int = option(8, low=0, high="max_context")
    sink_size_end: int = option(4, low=0, high="max_context")
    chunk_size: int = option(256, low=1)
    sketch_dimension: int = option(48, low=1, high="head_dim")
    blending: float | None = None
    seed: int | None = 0

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.blending is not None and self.blending < 0:
            raise ValueError(f"blending must be >= 0 or null, got {self.blending}")

    @property
    def leverage(self) -> LeverageScore:
        """The leverage scorer of the blend (the same sketch dimension and seed)."""
        return LeverageScore(sketch_dimension=self.sketch_dimension, seed=self.seed)

    def protected(self, bound: int) -> tuple[int, int]:
        """The ``sink_size_start`` first and ``sink_size_end`` last tokens, under ``bound``."""
        first = min(self.sink_size_start, bound)
        return first, min(self.sink_size_end, bound - first)

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """``blending * leverage + attention`` ``[batch, kv_heads, prompt]`` of the tokens between the
        sinks; the sinks score as the best of them (kvpress's padding)."""
        n = layer.keys.shape[2]
        start = min(self.sink_size_start, n)
        end = n - min(self.sink_size_end, n - start)
        scores = torch.zeros(layer.keys.shape[:3], device=layer.keys.device)
        if end - start < 2:  # nothing to rank (kvpress fails on an empty span)
            return scores
        lev = self.leverage.leverage(layer, pre_rope_keys(layer)[:, :, start:end])
        span = slice(start, end)
        att = non_causal_scores(
            query[:, :, span], layer.keys[:, :, span], layer.values[:, :, span], self.chunk_size
        )
        blending = self.blending
        if blending is None:  # the evicted share
            blending = 1 - min(n if layer.plan.keep is None else layer.plan.keep, n) / n
        mid = blending * lev + att
        scores[:, :, start:end] = mid
        best = mid.flatten(1).amax(1)[:, None, None]
        scores[:, :, :start] = best
        scores[:, :, end:] = best
        return scores
