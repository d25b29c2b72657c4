"""R-KV (Cai et al. 2025, "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models";
official code Zefan-Cai/R-KV, ``rkv/compression/r1_kv.py`` and ``rkv/utils.py``).

Decode-time compression of long generated traces: whenever the cache fills up, every KV head keeps
its observation window (the last ``window_size`` tokens) plus the prefix tokens with the highest
``Z = lambda * I - (1 - lambda) * R``, where the importance ``I`` is the window's attention (logits
max-pooled over the query heads of a group, softmax over the prefix, mean over the window's queries,
1-D max pooling over neighbouring tokens) and the redundancy ``R`` is a softmax over tokens of the
mean cosine similarity of a key to every key held, the diagonal and each key's most recent
similar copy (cosine above ``threshold``) zeroed (``cal_similarity``). Compression runs every
``buffer`` decoded tokens: the layer then goes from its bound back to ``bound + 1 - buffer`` slots,
so the plan's bound is the budget *including* the buffer (docs/methods.md, R-KV).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.checks import check_range
from methods.evict import ScoreEvict
from methods.scoring import pool_scores, window_logits
from methods.seam.contract import CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan


def redundancy(keys: torch.Tensor, threshold: float, chunk: int = 1024) -> torch.Tensor:
    """R-KV's redundancy ``[batch, kv_heads, slots]`` float32 of ``keys`` ``[batch, kv_heads, slots,
    head_dim]`` held in position order (``cal_similarity`` with ``retain_direction="last"``).

    ``S_ij = cos(k_i, k_j)`` with ``S_ii = 0``; in each row ``i`` the latest ``j`` with
    ``S_ij > threshold`` (the most recent similar copy, which is kept) is zeroed too; then
    ``R = softmax_j(mean_i S_ij)``. Rows go in chunks: memory ``O(chunk x slots)`` per head.
    """
    b, h, n, _ = keys.shape
    unit = F.normalize(keys.float(), dim=-1, eps=1e-8)
    index = torch.arange(n, device=keys.device)
    total = torch.zeros((b, h, n), dtype=torch.float32, device=keys.device)
    for start in range(0, n, chunk):
        rows = index[start : start + chunk]
        sim = torch.einsum("bhid,bhjd->bhij", unit[:, :, rows], unit)
        sim = sim.masked_fill(rows[:, None] == index[None, :], 0.0)
        latest = torch.where(sim > threshold, index, -1).amax(dim=-1, keepdim=True)
        sim = sim.masked_fill((index == latest) & (latest >= 0), 0.0)
        total += sim.sum(dim=2)
    return torch.softmax(total / n, dim=-1)


@dataclass
class RKV(ScoreEvict):
    """R-KV with the paper's and the official code's settings (lambda 0.1, window 8, kernel 7,
    similarity threshold 0.5, buffer 128).

    Parameters
    ----------
    mix_lambda : float
        ``lambda`` of ``Z = lambda I - (1 - lambda) R`` (paper: 0.1; the code's default 0.07).
    window_size : int
        Observation window (tokens), kept; at most the buffer.
    kernel_size : int
        Max-pooling kernel over the importance (odd; 1 disables pooling).
    threshold : float
        Cosine similarity above which two keys are copies of each other.
    buffer : int
        Decoded tokens between two compressions; a bound of ``B`` slots holds ``B + 1 - buffer``
        after each compression. A buffer above half the bound is cut to half the bound.

    Raises
    ------
    ValueError
        For ``mix_lambda`` outside ``[0, 1]``, a window or buffer < 1, an even kernel or a
        threshold outside ``[-1, 1]``.
    """

    name: ClassVar[str] = "rkv"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, decode_input="logits")

    mix_lambda: float = 0.1
    window_size: int = 8
    kernel_size: int = 7
    threshold: float = 0.5
    buffer: int = 128

    def __post_init__(self) -> None:
        check_range(self, "mix_lambda")
        if self.window_size < 1 or self.buffer < 1:
            raise ValueError(f"window_size and buffer must be >= 1, got {self.window_size}, {self.buffer}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and >= 1, got {self.kernel_size}")
        check_range(self, "threshold", low=-1.0)

    def split(self, bound: int) -> tuple[int, int, int]:
        """``(keep, buffer, window)`` under ``bound`` slots: the buffer (at most half the bound, at
        least 1), the slots kept by a compression ``bound + 1 - buffer``, the window (at most the
        buffer)."""
        buffer = max(1, min(self.buffer, bound // 2))
        return bound + 1 - buffer, buffer, min(self.window_size, buffer)

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """Bound = the budget (buffer included); ``keep`` = what a compression keeps; recent = the
        observation window; ``split`` = :meth:`split`. Prompt-only: the prompt compressed once to the
        budget (no buffer)."""
        plan = CompressionMethod.plan(self, layer)
        if plan.keep is None:
            return plan
        keep, buffer, window = self.split(plan.keep)
        if plan.bound is None:
            return replace(plan, recent=window)
        return replace(plan, keep=keep, recent=window, split=(keep, buffer, window))

    def protected(self, bound: int) -> tuple[int, int]:
        """No first tokens; the observation window of :meth:`split`."""
        return 0, self.split(bound)[2]

    def final_scores(self, keys: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
        """``Z = lambda * pool(I) - (1 - lambda) * R`` ``[batch, kv_heads, slots]`` of the slots held
        in position order, given the importance ``I`` of the prefix (all but the window); the
        window gets the prefix's highest score (kept in any case)."""
        prefix = importance.shape[-1]
        pooled = pool_scores(importance, self.kernel_size, "max")
        z = self.mix_lambda * pooled - (1 - self.mix_lambda) * redundancy(keys, self.threshold)[..., :prefix]
        top = z.amax(dim=-1, keepdim=True).expand(*z.shape[:2], keys.shape[2] - prefix)
        return torch.cat([z, top], dim=-1)

    def prefill_scores(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """``Z`` of every prompt token, the last ``window`` prompt queries observing; None without a
        budget."""
        n, plan = layer.store.n_slots, layer.plan
        if plan.keep is None:
            return None
        w = min(plan.recent, n - 1)
        if w < 1:
            return torch.zeros(layer.store.positions.shape, dtype=torch.float32, device=layer.keys.device)
        logits = window_logits(query, layer.keys, w, scaling, layer.spec.softcap)[..., : n - w]
        importance = torch.softmax(logits.amax(dim=2), dim=-1).mean(dim=2)
        return self.final_scores(layer.keys, importance)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Compress a prompt over the bound to ``plan.keep`` slots; a prompt within it is kept whole
        (R-KV compresses only when the cache is full). Prompt-only: over ``plan.keep``."""
        plan = layer.plan
        limit = plan.keep if plan.bound is None else plan.bound
        if limit is not None and layer.store.n_slots > limit:
            layer.store.keep(self.prefill_keep(layer, query, scaling))
            layer.store.write("scores", torch.zeros_like(layer.store.state["scores"]))

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor) -> None:
        """Add this step's attention to the scores when the token is one of the last ``window`` before
        the next compression (the observation window); compress once over the bound.

        ``probs`` are this step's scaled logits ``[batch, kv_heads, group, slots]``: max over the
        group, softmax over the tokens before the window. Steps outside the window add zero (the
        same computation at every step: one compiled graph besides the compression's).
        """
        plan, n = layer.plan, layer.store.n_slots
        if plan.bound is None:
            return
        keep, _, w = plan.split
        start = layer.tokens_seen() - n + plan.bound + 1 - w  # position of the window's first token
        pos = layer.store.positions
        logits = probs.amax(dim=2).masked_fill(pos >= start, -torch.inf)
        active = pos[..., n - 1 :] >= start  # this token is in the window
        layer.store.write("scores", layer.store.state["scores"] + torch.softmax(logits, dim=-1) * active)
        if n <= plan.bound:
            return
        z = self.final_scores(layer.keys, layer.store.state["scores"][..., : n - w] / w)
        top = z[..., : n - w].topk(keep - w, dim=-1).indices.sort(dim=-1).values
        window = torch.arange(n - w, n, device=z.device).expand(*z.shape[:2], w)
        layer.store.keep(torch.cat([top, window], dim=-1))
        layer.store.write("scores", torch.zeros_like(layer.store.state["scores"]))
