"""Observed attention (kvpress's ``ObservedAttentionPress``, its variant of H2O, Zhang et al. 2023).

A token's score is the **mean** attention it received from the queries that could attend to it: the
column sums of the causal prompt attention divided by the number of queries at or after the token
(``observed_attention_press.py``: ``attentions.sum(2) / arange(n, 0, -1)``, then the mean over the
query heads of a KV group). H2O sums instead, which favours old tokens. Prompt only, as kvpress;
``decode_budget=true`` keeps the mean up to date at every step and evicts the lowest. A
score-then-evict rule (``methods.evict``) with nothing protected (kvpress protects nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.scoring import causal_column_sums
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer


@dataclass
class ObservedAttention(ScoreEvict):
    """Mean attention received, per KV head (group mean of the query heads).

    Parameters
    ----------
    chunk_size : int
        Query rows per chunk of the prefill column sums (memory only, not results).

    Raises
    ------
    ValueError
        For ``chunk_size`` < 1.
    """

    name: ClassVar[str] = "observed_attention"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, prompt_only=True)

    chunk_size: int = 256

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """``[batch, kv_heads, prompt]``: column sums over the ``prompt - j`` queries that see token j,
        divided by that count."""
        sums = causal_column_sums(query, layer.keys, scaling, self.chunk_size, softcap=layer.spec.softcap)
        n = sums.shape[-1]
        return sums / torch.arange(n, 0, -1, device=sums.device, dtype=sums.dtype)

    def step_scores(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor:
        """The running mean with this step's probabilities ``[batch, kv_heads, slots]``: a token at
        position ``p`` has been seen by ``t - p`` queries after this step (``t`` tokens so far)."""
        seen = layer.tokens_seen() - layer.store.positions.to(probs.dtype)
        return (layer.store.state["scores"] * (seen - 1) + probs) / seen
