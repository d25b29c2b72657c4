"""KeyDiff (Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
Inference in Resource-Constrained Environments").

Per KV head the anchor is the mean of the L2-normalised keys in the cache; a token's score is the
negative cosine similarity of its key to the anchor (Eq. 4 and Algorithm 1), so the keys most
different from the mean are kept (kvpress's ``KeyDiffPress``: ``anchor = normalize(keys).mean``,
``score = -cosine_similarity(keys, anchor)``). Attention-free: decoding uses fused attention. At every
decode step the anchor is recomputed over the slots held (Algorithm 1 scores the cache plus the new
token). A score-then-evict rule (``methods.evict``): nothing protected (as the paper and kvpress).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer


def keydiff_scores(keys: torch.Tensor) -> torch.Tensor:
    """``-cos(k_i, mean_j k_j / ||k_j||)`` ``[batch, kv_heads, slots]`` float32 of ``keys``
    ``[batch, kv_heads, slots, head_dim]`` (the mean over the slots held)."""
    keys = keys.float()
    anchor = F.normalize(keys, p=2, dim=-1).mean(dim=2, keepdim=True)
    return -F.cosine_similarity(keys, anchor, dim=-1)


@dataclass
class KeyDiff(ScoreEvict):
    """KeyDiff: per KV head, keep the tokens whose keys are least similar to the mean key direction."""

    name: ClassVar[str] = "keydiff"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, decode_input="none")

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """Scores of the prompt's keys against the prompt's anchor."""
        return keydiff_scores(layer.keys)

    def step_scores(self, layer: CompressedLayer, probs: None) -> torch.Tensor:
        """Scores of every slot against the anchor of the slots held now."""
        return keydiff_scores(layer.keys)
