"""Uniform compression per fixed chunk (Corallo & Papotti 2024, "FINCH: Prompt-guided Key-Value Cache
Compression for Large Language Models", TACL, Sec. 3: the prompt processed chunk by chunk; kvpress's
``ChunkPress``).

A wrapper over any score-then-evict scorer (``methods.wrap``): the prompt is cut into chunks of
``chunk_length`` from token 0 (the last may be shorter) and the scorer, scoring each chunk alone
(``methods.subset``), keeps ``max(1, int(c x share))`` of a chunk's ``c`` tokens, ``share`` the
budget's share of the prompt (kvpress's ``1 - compression_ratio``). Every chunk is compressed alike,
however the scores spread over the prompt. Per KV head; the kept count is the sum over chunks (at most
the budget but for the one-token floor of a chunk). Once, at prefill (kvpress); decoding appends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from methods.checks import check_bounds, option
from methods.evict import ScoreEvict
from methods.knorm import KNorm
from methods.seam.layer import CompressedLayer
from methods.seam.plan import budget_share
from methods.subset import subset_keep
from methods.wrap import SubsetWrapper


def chunk_counts(prompt: int, chunk_length: int, share: float) -> list[tuple[int, int, int]]:
    """``(start, end, kept)`` per chunk of a ``prompt``-token prompt: chunks of ``chunk_length`` from
    token 0, each keeping ``max(1, int((end - start) x share))`` tokens (kvpress's ``ChunkPress``)."""
    spans = [(s, min(s + chunk_length, prompt)) for s in range(0, prompt, chunk_length)]
    return [(s, e, max(1, int((e - s) * share))) for s, e in spans]


@dataclass
class Chunk(SubsetWrapper):
    """Per-chunk compression over a scorer (kvpress names no scorer: KNorm here, a scorer whose chunk
    scores need nothing outside the chunk).

    Parameters
    ----------
    scorer : ScoreEvict
        Scores each chunk alone (its protected tokens: those of the chunk).
    chunk_length : int
        Tokens per chunk (kvpress: 1024).

    Raises
    ------
    ValueError
        For ``chunk_length`` < 1 or a scorer that ranks no tokens.
    """

    name: ClassVar[str] = "chunk"
    PAPER_SCORER: ClassVar[str] = "knorm"

    scorer: ScoreEvict = field(default_factory=KNorm)
    chunk_length: int = option(1024, low=1, high="max_context")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self)

    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """Each chunk's tokens kept by the scorer on that chunk alone (:func:`chunk_counts`,
        :func:`subset_keep`), ascending; None when the prompt fits the budget."""
        n = layer.store.n_slots
        if layer.plan.fits(n):
            return None
        b, h = layer.store.positions.shape[:2]
        share, dev = budget_share(layer.share, layer.budget, n), layer.keys.device
        parts = []
        for start, end, k in chunk_counts(n, self.chunk_length, share):
            chunk = torch.arange(start, end, device=dev).expand(b, h, -1)
            parts.append(subset_keep(self.scorer, layer, query, scaling, chunk, k))
        return torch.cat(parts, dim=-1)
