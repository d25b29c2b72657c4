"""TOVA: Token Omission Via Attention (Oren et al. 2024, "Transformers are Multi-State RNNs").

At every decode step the token with the lowest attention from the current query, averaged over all
heads of the layer, is dropped (Sec. 3.3, the TOVA policy); at prefill the last prompt query ranks
the prompt (as kvpress's ``TOVAPress``). A score-then-evict rule (``methods.evict``): protected =
the newest token (kvpress gives it the maximal score; the paper protects nothing), score = this
step's attention. docs/extending.md shows this class as its worked example.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.evict import ScoreEvict
from methods.scoring import window_attention
from methods.seam.layer import CompressedLayer


@dataclass
class TOVA(ScoreEvict):
    """TOVA: keep the tokens the current query attends to most, averaged over every head of the layer.

    Scores are ``[batch, kv_heads, slots]``, the same for every KV head (the mean of the group-mean
    probabilities over KV heads is the mean over all query heads), so every head keeps the same
    tokens in the same slots and the slot-wise mean stays valid at every step.

    Parameters
    ----------
    recent : int
        Newest tokens protected besides the newest one (0: the paper, kvpress).

    Raises
    ------
    ValueError
        For ``recent`` < 0.
    """

    name = "tova"

    recent: int = 0

    def __post_init__(self) -> None:
        if self.recent < 0:
            raise ValueError(f"recent must be >= 0, got {self.recent}")

    def protected(self, bound: int) -> tuple[int, int]:
        """No first tokens; the newest ``recent`` tokens (at least the newest one)."""
        return 0, min(max(self.recent, 1), bound)

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """The last prompt query's attention over the prompt, averaged over all heads."""
        probs = window_attention(query, layer.keys, 1, scaling, layer.spec.softcap)[:, :, -1]
        return probs.mean(1, keepdim=True).expand_as(probs)

    def step_scores(self, layer: CompressedLayer, probs: torch.Tensor | None) -> torch.Tensor | None:
        """This step's attention ``[batch, kv_heads, slots]``, averaged over all heads, replaces
        the scores."""
        return probs.mean(1, keepdim=True).expand_as(probs)
