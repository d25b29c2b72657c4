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
maximal score). ``whole_chunks=true`` (preset ``chunkkv_kvpress``) is kvpress's rule instead
(:func:`whole_chunks`). Once, at prefill (kvpress); decoding appends.
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
from methods.seam.plan import LayerPlan, budget_share
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


def whole_chunks(scores: torch.Tensor, chunk_length: int, share: float) -> torch.Tensor:
    """kvpress 0.5.5's ``ChunkKVPress``: the prompt cut into chunks of ``chunk_length`` from token 0
    (the last one partial), a chunk scored by the mean over its tokens of ``scores`` ``[batch, kv_heads,
    prompt]`` summed over the heads (batch row 0's choice for every row), and the top ``max(1,
    int(chunks x share))`` chunks kept whole, in every head; nothing protected. Returns the kept
    positions ``[batch, kv_heads, k]`` int64, ascending (``k`` a multiple of ``chunk_length`` unless
    the partial chunk is kept: not the budget, what kvpress keeps)."""
    b, h, n = scores.shape
    complete, rest = divmod(n, chunk_length)
    summed = scores.sum(dim=1)
    chunk = summed[:, : complete * chunk_length].view(b, complete, chunk_length).mean(dim=-1)
    if rest:
        chunk = torch.cat([chunk, summed[:, complete * chunk_length :].mean(dim=-1, keepdim=True)], dim=-1)
    kept = chunk.topk(max(1, int(chunk.shape[-1] * share)), dim=-1).indices[0]
    spans = [(s, min(s + chunk_length, n)) for s in (kept * chunk_length).tolist()]
    index = torch.cat([torch.arange(s, e, device=scores.device) for s, e in spans])
    return index.sort().values.view(1, 1, -1).expand(b, h, -1)


@dataclass
class ChunkKV(ScorerWrapper):
    """ChunkKV over a scorer (kvpress: SnapKV, window 64, kernel 5, average pooling).

    Parameters
    ----------
    scorer : ScoreEvict
        Scores the prompt's tokens; its protected tokens are kept besides the chunks.
    chunk_length : int
        Tokens per chunk (kvpress: 20).
    whole_chunks : bool
        kvpress's rule (:func:`whole_chunks`: whole chunks only, nothing protected, the chunk count
        from the budget's share; the scorer's protected tokens scored as kvpress's SnapKV scores its
        window, the prefix maximum + 1); False: exactly the budget (module docstring).

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
    whole_chunks: bool = False

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
        if plan.fits(layer.store.n_slots):
            return None
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is None:
            return self.scorer.prefill_keep(layer, query, scaling)
        if self.whole_chunks:  # no whole chunk: the scorer's selection (kvpress delegates to the press)
            if layer.store.n_slots < self.chunk_length:
                return self.scorer.prefill_keep(layer, query, scaling)
            return self._kvpress_keep(layer, scores)
        priority = chunk_priority(scores, plan.first, plan.recent, self.chunk_length)
        return keep_index(priority, plan.first, plan.keep - plan.first - plan.recent, plan.recent)

    def kvpress_scores(self, layer: CompressedLayer, scores: torch.Tensor) -> torch.Tensor:
        """The scorer's ``scores`` ``[batch, kv_heads, prompt]`` float32 on kvpress's scale
        (``score_scale``), its protected tokens at the prefix maximum + 1 (kvpress's SnapKV window)."""
        n, plan = layer.store.n_slots, layer.plan
        scores = scores.float() * self.scorer.score_scale(layer)
        if plan.first or plan.recent:
            body = scores[..., plan.first : n - plan.recent]
            top = body.max() + 1
            scores = scores.clone()
            scores[..., : plan.first] = top
            scores[..., n - plan.recent :] = top
        return scores

    def _kvpress_keep(self, layer: CompressedLayer, scores: torch.Tensor) -> torch.Tensor:
        """:func:`whole_chunks` over :meth:`kvpress_scores`."""
        share = budget_share(layer.share, layer.budget, layer.store.n_slots)
        return whole_chunks(self.kvpress_scores(layer, scores), self.chunk_length, share)

    prefill = ScoreEvict.prefill
    decode_attention = CompressionMethod.decode_attention
