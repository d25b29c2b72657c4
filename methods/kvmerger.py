"""KVMerger: adaptive KV merging by key similarity (Wang, Jin, Yu, Zhang 2024, "Model Tells You
Where to Merge").

Once, after prefill (no official code; docs/methods.md, "KVMerger"):

1. Protect the most recent ``recent_ratio * L`` tokens and the ``heavy_ratio * L`` tokens with the
   highest aggregated attention (column sums of the causal prompt attention, chunked; GQA: group
   mean). Protected tokens are never merged and end a merging set.
2. Merging sets (Algorithm 1): scanning from the last token to the first, a token joins the current
   set if its key's cosine similarity to the set's anchor (the set's last token) exceeds ``theta``,
   else it starts a new set. Sets are contiguous.
3. Gaussian-kernel merge (Algorithm 2): each set collapses into its pivot (highest aggregated
   attention) with weights ``g_i = exp(-||k_p - k_i||^2 / (2 sigma^2))`` normalised over the set,
   ``sigma`` = mean L2 distance of the other members to the pivot (uniform if 0); values use the
   key weights.

With a fixed ``theta`` the slot count is an outcome and differs per head: heads are padded to the
layer's largest count with slots whose ``log_weight`` is ``-inf`` (never attended; their memory is
counted). ``exact_budget`` reaches the budget on every head instead by joining the most similar
adjacent tokens first. Decoded tokens are appended uncompressed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.checks import check_range
from methods.scoring import causal_column_sums
from methods.seam.contract import CompressionMethod, Traits
from methods.seam.layer import CompressedLayer

PAPER_PROTECTED_SHARE = (0.17 + 0.12) / 0.5  # protected share of the budget in the paper's 50% setting


@dataclass
class KVMerger(CompressionMethod):
    """KVMerger with the paper's 50% setting as defaults (``kvmerger_35`` preset: 0.08 / 0.02).

    Parameters
    ----------
    recent_ratio : float
        Recent tokens protected, as a fraction of the prompt (0.17).
    heavy_ratio : float
        Heavy hitters protected, as a fraction of the prompt (0.12).
    theta : float
        Cosine threshold of merging-set identification (0.75).
    exact_budget : bool
        Reach the slot budget on every head: the protected counts are scaled down to
        ``PAPER_PROTECTED_SHARE`` of the budget when they would exceed it, and the most similar
        adjacent unprotected tokens are joined first (protected tokens join sets only when the
        budget cannot be met otherwise). False: fixed ``theta``, budget ignored.
    chunk_size : int
        Query rows per chunk of the aggregated-attention pass.

    Raises
    ------
    ValueError
        For ratios outside ``[0, 1]`` or summing above 1, or ``theta`` outside ``[-1, 1]``.
    """

    name: ClassVar[str] = "kvmerger"
    #: prompt-only; its padded heads keep the log-weight bias
    TRAITS: ClassVar[Traits] = Traits(prompt_only=True, decode_rule=False, decode_input="none", merges=True)

    recent_ratio: float = 0.17
    heavy_ratio: float = 0.12
    theta: float = 0.75
    exact_budget: bool = False
    chunk_size: int = 256

    @cached_property
    def traits(self) -> Traits:
        """The declared traits; the budget applies only with ``exact_budget`` (with a fixed
        ``theta`` the kept ratio is an outcome)."""
        return self.with_decode_budget(replace(self.TRAITS, budget_applies=self.exact_budget))

    def __post_init__(self) -> None:
        check_range(self, "recent_ratio", "heavy_ratio")
        if self.recent_ratio + self.heavy_ratio > 1.0:
            raise ValueError("recent_ratio + heavy_ratio must be <= 1")
        check_range(self, "theta", low=-1.0)

    def protected_counts(self, length: int, budget: int | None) -> tuple[int, int]:
        """``(recent, heavy)`` protected tokens for a prompt of ``length`` tokens."""
        recent, heavy = int(self.recent_ratio * length), int(self.heavy_ratio * length)
        if self.exact_budget and budget is not None and recent + heavy > PAPER_PROTECTED_SHARE * budget:
            scale = PAPER_PROTECTED_SHARE * budget / (recent + heavy)
            recent, heavy = int(recent * scale), int(heavy * scale)
        return recent, heavy

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Protect, identify merging sets, Gaussian-merge each set into its pivot."""
        length = layer.store.n_slots
        budget = layer.plan.keep
        if self.exact_budget and (budget is None or length <= budget):
            return
        acc = causal_column_sums(query, layer.keys, scaling, self.chunk_size, softcap=layer.spec.softcap)
        protected = self._protected(acc, *self.protected_counts(length, budget))
        if self.exact_budget:
            set_id = self._adjacent_sets(layer.keys, protected, length - budget)
        else:
            set_id = self._anchor_sets(layer.keys, protected)
        self._merge(layer, acc, set_id)

    @staticmethod
    def _protected(acc: torch.Tensor, recent: int, heavy: int) -> torch.Tensor:
        """``[batch, kv_heads, L]`` bool: the last ``recent`` tokens and top-``heavy`` of the rest."""
        length = acc.shape[-1]
        mask = torch.zeros_like(acc, dtype=torch.bool)
        mask[..., length - recent :] = True
        if heavy:
            mask.scatter_(2, acc[..., : length - recent].topk(heavy, dim=-1).indices, True)
        return mask

    def _anchor_sets(self, keys: torch.Tensor, protected: torch.Tensor) -> torch.Tensor:
        """Algorithm 1, vectorised over heads: set id per token, ids growing from the last token."""
        b, h, length, _ = keys.shape
        unit = F.normalize(keys.float(), dim=-1)
        set_id = torch.empty((b, h, length), dtype=torch.long, device=keys.device)
        current = torch.full((b, h), -1, dtype=torch.long, device=keys.device)
        anchor = torch.full((b, h), -1, dtype=torch.long, device=keys.device)
        for i in range(length - 1, -1, -1):
            anchor_key = unit.gather(
                2, anchor.clamp(min=0)[..., None, None].expand(-1, -1, 1, unit.shape[-1])
            )
            similar = (unit[:, :, i] * anchor_key[:, :, 0]).sum(-1) > self.theta
            join = ~protected[:, :, i] & (anchor >= 0) & similar
            current = current + (~join).long()
            anchor = torch.where(protected[:, :, i], -1, torch.where(join, anchor, i))
            set_id[:, :, i] = current
        return set_id

    @staticmethod
    def _adjacent_sets(keys: torch.Tensor, protected: torch.Tensor, joins: int) -> torch.Tensor:
        """Join the ``joins`` most similar adjacent pairs, unprotected first: exactly L - joins sets."""
        unit = F.normalize(keys.float(), dim=-1)
        sim = (unit[:, :, 1:] * unit[:, :, :-1]).sum(-1)  # boundary i joins tokens i and i+1
        either_protected = protected[:, :, 1:] | protected[:, :, :-1]
        priority = torch.where(either_protected, sim - 4.0, sim)  # cosine is >= -1: unprotected first
        joined = torch.zeros_like(sim, dtype=torch.bool).scatter_(
            2, priority.topk(joins, dim=-1).indices, True
        )
        starts = torch.cat([torch.ones_like(joined[..., :1]), ~joined], dim=-1)  # token opens a set
        return starts.long().cumsum(-1) - 1

    def _merge(self, layer: CompressedLayer, acc: torch.Tensor, set_id: torch.Tensor) -> None:
        """Algorithm 2 on every set at once; pad heads with fewer sets (log_weight -inf)."""
        b, h, length = set_id.shape
        set_id = set_id - set_id.amin(dim=-1, keepdim=True)
        n_sets = set_id.amax(dim=-1) + 1  # [b, h]
        slots = int(n_sets.max())
        pos = torch.arange(length, device=acc.device).expand(b, h, length)
        best = acc.new_full((b, h, slots), -torch.inf).scatter_reduce(2, set_id, acc, "amax")
        is_best = acc == best.gather(2, set_id)
        pivot = torch.full((b, h, slots), -1, dtype=torch.long, device=acc.device)
        pivot = pivot.scatter_reduce(2, set_id, torch.where(is_best, pos, -1), "amax")
        keys = layer.keys.to(torch.promote_types(layer.keys.dtype, torch.float32))
        d = keys.shape[-1]
        pivot_of_token = pivot.gather(2, set_id)
        dist = (keys - keys.gather(2, pivot_of_token[..., None].expand(-1, -1, -1, d))).norm(dim=-1)
        count = torch.zeros((b, h, slots), dtype=dist.dtype, device=acc.device).scatter_add(
            2, set_id, torch.ones_like(dist)
        )
        sigma = torch.zeros_like(count).scatter_add(2, set_id, dist) / (count - 1).clamp(min=1)
        sig = sigma.gather(2, set_id)
        g = torch.where(
            sig > 0, torch.exp(-(dist**2) / (2 * sig.clamp(min=1e-30) ** 2)), torch.ones_like(dist)
        )
        w = g / torch.zeros_like(count).scatter_add(2, set_id, g).gather(2, set_id)

        def weighted(t: torch.Tensor) -> torch.Tensor:
            acc_t = t.to(w.dtype)
            out = acc_t.new_zeros((b, h, slots, t.shape[-1]))
            out.scatter_add_(2, set_id[..., None].expand(-1, -1, -1, t.shape[-1]), w[..., None] * acc_t)
            return out.to(t.dtype)

        real = torch.arange(slots, device=acc.device) < n_sets[..., None]
        layer.store.reset(
            keys=weighted(layer.keys),
            values=weighted(layer.values),
            log_weight=torch.where(real, 0.0, -torch.inf).to(torch.float32),
            positions=torch.where(real, pivot, -1),
        )
