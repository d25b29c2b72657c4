"""Leverage scores of the key matrix (Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV
Cache Compression with Approximate Leverage Scores", arXiv 2507.08143; kvpress's
``LeverageScorePress``).

Keys that stand out geometrically carry information the others do not: per KV head, the pre-RoPE keys
are centred over the sequence and sketched on the right by a Gaussian ``Phi`` ``[head_dim, s]``
(``X = (K - mean) Phi``), and token i's score is its leverage ``x_i^T (X^T X)^{-1} x_i`` (a Cholesky
solve, with kvpress's jitter: ``1e-2 I`` first, ten times more until it factorises), z-scored. As
``leverage_press.py``, except: the sketch is seeded (``seed``, the layer) and shared by the rows of a
batch, the sketch and the solve run in float32, and the z-score is per batch row (kvpress: over the
batch). Query-agnostic, prompt only (kvpress: prefill only); nothing protected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.checks import option
from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer
from methods.seam.rope import rotate


def cholesky_with_jitter(gram: torch.Tensor, jitter: float = 1e-2, tries: int = 5) -> torch.Tensor:
    """Lower Cholesky factor of ``gram + jitter I`` ``[..., s, s]``, the jitter ten times larger after
    each failure (kvpress's ``chol_with_jitter``).

    Raises
    ------
    RuntimeError
        When no try factorises.
    """
    eye = torch.eye(gram.shape[-1], device=gram.device, dtype=gram.dtype)
    for _ in range(tries):
        chol, info = torch.linalg.cholesky_ex(gram + jitter * eye)
        if not bool(info.any()):
            return chol
        jitter *= 10
    raise RuntimeError(f"Cholesky failed after {tries} tries")


@dataclass
class LeverageScore(ScoreEvict):
    """Approximate leverage scores of the pre-RoPE keys, per KV head.

    Parameters
    ----------
    sketch_dimension : int
        Columns ``s`` of the Gaussian sketch (kvpress: 48).
    seed : int | None
        Seed of the sketch (with the layer index); None: kvpress's draw, ``[1, kv_heads, head_dim,
        s]`` from torch's global generator at each layer's prefill (unseeded unless the caller
        seeds it: the reference comparison, ``scripts/kvpress_kept_sets.py``).

    Raises
    ------
    ValueError
        For ``sketch_dimension`` < 1.
    """

    name: ClassVar[str] = "leverage_score"
    TRAITS: ClassVar[Traits] = replace(
        ScoreEvict.TRAITS, prompt_only=True, decode_rule=False, decode_input="none"
    )

    sketch_dimension: int = option(48, low=1, high="head_dim")
    seed: int | None = 0

    def __post_init__(self) -> None:
        if self.sketch_dimension < 1:
            raise ValueError(f"sketch_dimension must be >= 1, got {self.sketch_dimension}")

    def sketch(self, layer: CompressedLayer, heads: int, dim: int, device: torch.device) -> torch.Tensor:
        """``Phi`` ``[kv_heads, head_dim, s]`` float32, entries N(0, 1/s), seeded by ``seed`` and layer
        (None: torch's global generator, kvpress's draw; its ``[1, kv_heads, ...]`` holds the same
        numbers in the same order)."""
        gen = None
        if self.seed is not None:
            gen = torch.Generator(device=device).manual_seed(self.seed * 100_003 + layer.spec.layer_idx)
        phi = torch.randn(heads, dim, self.sketch_dimension, generator=gen, device=device)
        return phi / math.sqrt(self.sketch_dimension)

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """z-scored leverage ``[batch, kv_heads, prompt]`` of every prompt token."""
        return self.leverage(layer, pre_rope_keys(layer))

    def leverage(self, layer: CompressedLayer, keys: torch.Tensor) -> torch.Tensor:
        """z-scored leverage ``[batch, kv_heads, n]`` float32 of the pre-RoPE keys ``[batch, kv_heads, n,
        head_dim]`` (a span of the prompt: Compactor scores the tokens between its sinks), centred over
        the span, sketched by :meth:`sketch` (one draw per call)."""
        h, d = keys.shape[1], keys.shape[3]
        x = (keys - keys.mean(-2, keepdim=True)) @ self.sketch(layer, h, d, keys.device)
        xt = x.transpose(-2, -1)
        gram = xt @ x
        chol = cholesky_with_jitter(0.5 * (gram + gram.transpose(-2, -1)))
        return z_score((x * torch.cholesky_solve(xt, chol).transpose(-2, -1)).sum(-1).clamp_min(0))


def pre_rope_keys(layer: CompressedLayer) -> torch.Tensor:
    """The prompt's keys turned back by their positions, ``R(-p) k``: ``[batch, kv_heads, prompt,
    head_dim]`` float32 (the layer's keys as they are without RoPE)."""
    keys = layer.keys.float()
    if layer.spec.rotary is not None:
        cos, sin = layer.spec.rotary.table(torch.arange(keys.shape[2], device=keys.device), torch.float32)
        keys = rotate(keys, cos, -sin)
    return keys


def z_score(scores: torch.Tensor) -> torch.Tensor:
    """``(s - mean) / max(std, 1e-6)`` of ``[batch, kv_heads, n]`` scores over all heads and tokens of
    each batch row (kvpress: over the whole batch; the unbiased std, as ``torch.std``)."""
    flat = scores.flatten(1)
    z = (flat - flat.mean(1, keepdim=True)) / flat.std(1, keepdim=True).clamp_min(1e-6)
    return z.view(scores.shape)
