"""Random eviction: the floor every leaderboard shows (kvpress's ``RandomPress``, seeded).

Each token gets a fixed uniform score in ``[0, 1)`` from an integer hash of (seed, layer, KV head,
position), so the kept set is a uniformly random subset, reproducible, with no random-generator state
(a compiled decode step stays one graph). A score-then-evict rule (``methods.evict``): nothing
protected (as kvpress), at prefill and at every decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer

MASK = 0xFFFFFFFF


def _int32(c: int) -> int:
    """``c`` as a signed 32-bit integer (equal modulo 2^32, so every masked hash is unchanged): the
    multipliers appear as literals in Triton kernels that inductor writes, where index arithmetic is
    int32 and a literal of 2^31 or more fails to compile."""
    return c - (1 << 32) if c >= 1 << 31 else c


GOLDEN, HEAD_MIX, LAYER_MIX, SEED_MIX, ROUND_MIX = map(
    _int32, (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x45D9F3B)
)


def hashed_uniform(positions: torch.Tensor, seed: int, layer_idx: int) -> torch.Tensor:
    """Uniform ``[0, 1)`` float32 per slot, a 32-bit integer hash (two xor-shift-multiply rounds) of
    ``positions`` ``[batch, kv_heads, slots]`` int64, the KV head, the layer and the seed."""
    head = torch.arange(positions.shape[1], device=positions.device).view(1, -1, 1)
    salt = _int32((layer_idx * LAYER_MIX + seed * SEED_MIX) & MASK)  # one int32 literal
    x = (positions * GOLDEN + head * HEAD_MIX + salt) & MASK
    for _ in range(2):
        x = (((x ^ (x >> 16)) & MASK) * ROUND_MIX) & MASK
    return ((x ^ (x >> 16)) & MASK).float() / 2.0**32


@dataclass
class Random(ScoreEvict):
    """Random: per KV head, keep a seeded uniformly random subset of the tokens.

    Parameters
    ----------
    seed : int
        Seed of the scores (the same seed keeps the same tokens).
    """

    name: ClassVar[str] = "random"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, decode_input="none")

    seed: int = 0

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """The prompt tokens' hashed scores."""
        return hashed_uniform(layer.store.positions, self.seed, layer.spec.layer_idx)

    def step_scores(self, layer: CompressedLayer, probs: None) -> torch.Tensor:
        """Every slot's hashed score (fixed per token)."""
        return hashed_uniform(layer.store.positions, self.seed, layer.spec.layer_idx)
