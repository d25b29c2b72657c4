"""ChunkKV gated by within-chunk score entropy (kvpress 0.5.5's ``EntropyGatedChunkKVPress``, after
ChunkKV, Liu et al. 2025, arXiv 2502.00299).

A wrapper over any score-then-evict scorer, as ChunkKV (``methods.chunkkv``): the scorer's scores on
kvpress's scale (its protected tokens at the prefix maximum + 1), summed over the layer's KV heads,
over chunks of ``chunk_length`` from token 0 (the last may be shorter). Chunks are visited by their
mean score, best first, while budget remains: a chunk at or above the median chunk score whose
normalised entropy (of its token scores, shifted to be non-negative) is below the median entropy is
"spiky" and gives only its best ``low_entropy_chunk_length`` tokens; any other chunk is kept whole
(or its best tokens, when the remaining budget is smaller). Budget left over is spent on the best
tokens not yet kept: exactly the budget, the same tokens in every head. Once, at prefill; decoding
appends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from methods.checks import option
from methods.chunkkv import ChunkKV
from methods.seam.layer import CompressedLayer

EPSILON = 1e-8  # kvpress's, in the entropy's normaliser and logarithm


def chunk_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Normalised entropy ``[chunks]`` in ``[0, 1]`` of equal-length chunks of token scores ``scores``
    ``[chunks, length]`` float32: each chunk shifted by its minimum when negative, divided by its sum
    (+ ``EPSILON``), ``-sum p log(p + EPSILON) / log(length)``; 0 for chunks of one token."""
    length = scores.shape[-1]
    if length == 1:
        return scores.new_zeros(scores.shape[0])
    shifted = scores - scores.amin(dim=-1, keepdim=True).clamp(max=0.0)
    p = shifted / (shifted.sum(dim=-1, keepdim=True) + EPSILON)
    h = -(p * (p + EPSILON).log()).sum(dim=-1)
    return (h / math.log(length)).clamp(0.0, 1.0)


def entropy_gated_keep(token: torch.Tensor, chunk_length: int, spiky_keep: int, budget: int) -> torch.Tensor:
    """The positions (ascending, int64) kept of a prompt whose head-summed token scores are ``token``
    ``[prompt]`` float32 (module docstring): ``budget`` of them, or the whole prompt if smaller.

    Medians are the lower middle values (``torch.median``); a chunk ties broken by position.
    """
    n = token.shape[0]
    full = n // chunk_length * chunk_length
    whole = token[:full].view(-1, chunk_length)
    mean, entropy = whole.mean(dim=1), chunk_entropy(whole)
    if full < n:  # the partial last chunk
        mean = torch.cat([mean, token[full:].mean().unsqueeze(0)])
        entropy = torch.cat([entropy, chunk_entropy(token[None, full:])])
    spiky = ((mean >= mean.median()) & (entropy < entropy.median())).tolist()
    keep = torch.zeros(n, dtype=torch.bool, device=token.device)
    for c in mean.argsort(descending=True, stable=True).tolist():
        if budget <= 0:
            break
        start, end = c * chunk_length, min((c + 1) * chunk_length, n)
        k = min(end - start, budget, spiky_keep if spiky[c] else n)
        if k == end - start:
            keep[start:end] = True
        else:
            keep[start + token[start:end].topk(k).indices] = True
        budget -= k
    rest = (~keep).nonzero().squeeze(-1)
    if budget > 0 and rest.numel():
        keep[rest[token[rest].topk(min(budget, rest.numel())).indices]] = True
    return keep.nonzero().squeeze(-1)


@dataclass
class EntropyGatedChunkKV(ChunkKV):
    """ChunkKV with kvpress's entropy gate (module docstring) over a scorer (kvpress: SnapKV, window
    64, kernel 5, average pooling).

    Parameters
    ----------
    scorer : ScoreEvict
        Scores the prompt's tokens (its protected tokens score the prefix maximum + 1).
    chunk_length : int
        Tokens per chunk (kvpress: 10).
    low_entropy_chunk_length : int
        Tokens kept of a spiky chunk (kvpress: 4), ``1 <= low_entropy_chunk_length < chunk_length``.

    Raises
    ------
    ValueError
        For lengths outside those bounds or a scorer that ranks no tokens.
    """

    name: ClassVar[str] = "entropy_gated_chunkkv"

    chunk_length: int = option(10, low=2, high="max_context")
    low_entropy_chunk_length: int = option(4, low=1, high="max_context")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.whole_chunks:
            raise ValueError("entropy_gated_chunkkv has no whole_chunks option (its rule is kvpress's)")
        if not 1 <= self.low_entropy_chunk_length < self.chunk_length:
            raise ValueError(
                "need 1 <= low_entropy_chunk_length < chunk_length, got "
                f"{self.low_entropy_chunk_length} and {self.chunk_length}"
            )

    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """:func:`entropy_gated_keep` per batch row over the head-summed :meth:`ChunkKV.kvpress_scores`
        (kvpress: batch row 0's for every row); a scorer that ranks by position selects as it does
        alone; None when the prompt fits."""
        plan = layer.plan
        if plan.fits(layer.store.n_slots):
            return None
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is None:
            return self.scorer.prefill_keep(layer, query, scaling)
        token = self.kvpress_scores(layer, scores).sum(dim=1)  # [batch, prompt]
        rows = [
            entropy_gated_keep(row, self.chunk_length, self.low_entropy_chunk_length, plan.keep)
            for row in token
        ]
        h = scores.shape[1]
        return torch.stack(rows)[:, None].expand(-1, h, -1)
