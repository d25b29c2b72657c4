"""ChunkKV (Liu et al. 2025, "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient
Long-Context LLM Inference"; kvpress's ``ChunkKVPress``): chunks of contiguous tokens as the eviction
unit.

A wrapper over any score-then-evict scorer (``methods.wrap``): the unprotected prompt tokens are cut
into chunks of ``chunk_length`` from the first one (the last chunk may be shorter); a chunk's score is
the mean over its tokens of the scorer's scores summed over the layer's KV heads (kvpress:
``scores.sum(dim=1)`` then the mean over the chunk), and the layer keeps the best chunks whole, the
same tokens in every head. KVBench keeps exactly the budget: the scorer's protected tokens, then
whole chunks in rank order, the chunk that does not fit contributing its best tokens (kvpress keeps
``max(1, int(chunks x (1 - ratio)))`` whole chunks and protects nothing: its SnapKV gives the window the
maximal score). Once, at prefill (kvpress); decoding appends.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from methods.checks import option
from methods.evict import ScoreEvict
from methods.scoring import keep_index
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.snapkv import SnapKV
from methods.wrap import ScorerWrapper


def chunk_priority(scores: torch.Tensor, first: int, recent: int, chunk_length: int) -> torch.Tensor:
    """Priorities ``[batch, kv_heads, prompt]`` float64 (higher: keep) whose top-k is whole chunks in
    rank order, then the best tokens of the next chunk; only ``first .. prompt - recent - 1`` are ranked.

    ``scores`` ``[batch, kv_heads, prompt]``: the scorer's. Chunk ranks are integers and a token's rank
    inside the candidates is below 1, so the order is chunk first, token second (ties: lower index).
    """
    b, h, n = scores.shape
    token = scores[..., first : n - recent].double().sum(1)  # [batch, candidates], summed over heads
    m = token.shape[-1]
    chunk = torch.arange(m, device=scores.device) // chunk_length
    size = torch.bincount(chunk).to(token.dtype)
    mean = token.new_zeros(b, len(size)).index_add_(1, chunk, token) / size
    chunk_rank = mean.argsort(dim=-1, descending=True, stable=True).argsort(-1)
    token_rank = token.argsort(dim=-1, stable=True).argsort(-1) / max(m, 1)  # [0, 1): the better, the higher
    priority = scores.new_zeros((b, n), dtype=torch.float64)
    priority[:, first : n - recent] = token_rank - chunk_rank.gather(1, chunk.expand(b, m))
    return priority[:, None].expand(b, h, n)


@dataclass
class ChunkKV(ScorerWrapper):
    """ChunkKV over a scorer (kvpress: SnapKV, window 64, kernel 5, average pooling).

    Parameters
    ----------
    scorer : ScoreEvict
        Scores the prompt's tokens; its protected tokens are kept besides the chunks.
    chunk_length : int
        Tokens per chunk (kvpress: 20).

    Raises
    ------
    ValueError
        For ``chunk_length`` < 1 or a scorer that ranks no tokens.
    """

    name: ClassVar[str] = "chunkkv"
    #: chunks are chosen once, at prefill (kvpress); decoding appends
    OVERRIDES: ClassVar[dict] = {"prompt_only": True, "decode_rule": False, "decode_input": "none"}
    PAPER_SCORER: ClassVar[str] = "snapkv"  # the paper's and kvpress's: named ``chunkkv``

    scorer: ScoreEvict = field(default_factory=lambda: SnapKV(window_size=64, kernel_size=5, pooling="avg"))
    chunk_length: int = option(20, low=1, high="max_context")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_length < 1:
            raise ValueError(f"chunk_length must be >= 1, got {self.chunk_length}")

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The scorer's plan with no decode bound."""
        return replace(self.scorer.plan(layer), bound=None)

    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """The protected tokens and the chunks' top ``keep - protected`` tokens (:func:`chunk_priority`);
        a scorer that ranks by position selects as it does alone."""
        plan = layer.plan
        if plan.keep is None or layer.store.n_slots <= plan.keep:
            return None
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is None:
            return self.scorer.prefill_keep(layer, query, scaling)
        priority = chunk_priority(scores, plan.first, plan.recent, self.chunk_length)
        return keep_index(priority, plan.first, plan.keep - plan.first - plan.recent, plan.recent)

    prefill = ScoreEvict.prefill
    decode_attention = CompressionMethod.decode_attention
