"""Block-wise iterative compression (Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache
Eviction for Long-Context LLM Inference in Resource-Constrained Environments", Sec. 3 and Algorithm 1:
the prompt processed block by block under a fixed cache; kvpress's ``BlockPress``).

A wrapper over any score-then-evict scorer (``methods.wrap``): the layer starts from the prompt's
first ``keep`` tokens; each following block of ``block_size`` tokens joins them and the scorer,
scoring those ``keep + block`` tokens alone (``methods.subset``), keeps ``keep`` of them; the last
block's survivors are the layer's. As kvpress, a simulation of block-wise prefill: the whole prompt's
keys, values and queries come from one forward. Per KV head (each head its own tokens), exactly the
budget; once, at prefill; decoding appends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from methods.checks import check_bounds, option
from methods.evict import ScoreEvict
from methods.keydiff import KeyDiff
from methods.seam.layer import CompressedLayer
from methods.subset import subset_keep
from methods.wrap import SubsetWrapper


def block_keep(
    select, prompt: int, keep: int, block_size: int, batch: int, heads: int, device: torch.device
) -> torch.Tensor:
    """The tokens ``[batch, heads, keep]`` (ascending) that survive block-wise compression of a
    ``prompt``-token prompt to ``keep`` tokens: start from tokens ``0 .. keep - 1``; for each block of
    ``min(block_size, prompt)`` tokens from token ``keep`` on, ``select(candidates, keep)`` keeps
    ``keep`` of the survivors plus the block (``candidates`` ``[batch, heads, m]`` ascending)."""
    kept = torch.arange(keep, device=device).expand(batch, heads, keep)
    size = min(block_size, prompt)
    for start in range(keep, prompt, size):
        block = torch.arange(start, min(start + size, prompt), device=device).expand(batch, heads, -1)
        kept = select(torch.cat([kept, block], dim=-1), keep)
    return kept


@dataclass
class Block(SubsetWrapper):
    """Block-wise compression over a scorer (kvpress's ``block_keydiff``: KeyDiff, blocks of 128).

    Parameters
    ----------
    scorer : ScoreEvict
        Scores each block with the tokens kept so far (its protected tokens: those of that subset).
    block_size : int
        Tokens per block (kvpress: 128).

    Raises
    ------
    ValueError
        For ``block_size`` < 1 or a scorer that ranks no tokens.
    """

    name: ClassVar[str] = "block"
    PAPER_SCORER: ClassVar[str] = "keydiff"

    scorer: ScoreEvict = field(default_factory=KeyDiff)
    block_size: int = option(128, low=1, high="max_context")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self)

    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """:func:`block_keep` with the scorer's selection on each subset (:func:`subset_keep`); None
        when the prompt fits."""
        keep, n = layer.plan.keep, layer.store.n_slots
        if layer.plan.fits(n):
            return None
        b, h = layer.store.positions.shape[:2]

        def select(candidates: torch.Tensor, k: int) -> torch.Tensor:
            return subset_keep(self.scorer, layer, query, scaling, candidates, k)

        return block_keep(select, n, keep, self.block_size, b, h, layer.keys.device)
