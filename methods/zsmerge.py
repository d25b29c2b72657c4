"""ZSMerge: zero-shot KV cache compression by residual merging (Liu, Liu, Tang; "ZSMerge").

Per KV head the budget ``B = B_p + B_c + B_r`` (Eq. 3) holds a proximity window (the latest
``B_p`` tokens), a context set (``B_c`` tokens of highest contribution score, Eq. 5) and ``B_r``
residual slots into which evicted tokens are merged (Eqs. 6-7); every slot's attention logit gets
``alpha * log(w)`` for its fusion count ``w`` (Eq. 8).

Slot layout: residual slots first (``positions == -1``), then context and proximity tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

import torch

from methods.checks import check_range
from methods.scoring import causal_column_sums, keep_index, lowest_score, pool_scores, window_attention
from methods.seam.contract import CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.uniform import gather_slots

ORDERS = ("code", "paper")


@dataclass
class ZSMerge(CompressionMethod):
    """ZSMerge with the paper's recommended settings (App. C.2) as defaults.

    Parameters
    ----------
    proximity_ratio : float
        ``B_p / B`` (0.5); a value >= 1 is an absolute slot count. At least 1 slot.
    residual_ratio : float
        ``B_r / (B - B_p)`` (0.02, at least one slot when > 0); >= 1 is absolute (``2`` gives
        Table 2's stated setting); 0 turns ZSMerge into pure eviction.
    alpha : float
        Compensation scale of Eq. 8 in ``[0, 1]`` (1); 0 gives eviction-like scoring.
    lam : float
        Decay lambda of the contribution score, Eq. 5 (0.98).
    window_size : int | None
        Prompt queries that initialise the scores at prefill (App. B: 8), weighted
        ``lam ** (window - 1 - i)``; None uses every prompt query (the ZeroMerge code used for
        the XSum tables), computed in chunks.
    pool_kernel : int
        Max-pooling kernel over the initial scores (official code: 5; 1 disables).
    order : str
        ``"code"`` (default; the official code's order, which produced the papers' numbers): the
        token leaving the proximity window is not an eviction candidate in that step;
        ``"paper"``: Algorithm 1, where it is. In both orders empty residual slots are filled
        before merging starts (Algorithm 1, lines 12-13).

    Raises
    ------
    ValueError
        For hyperparameters outside their ranges, or (at run time) a budget too small to hold
        ``B_p + B_r`` plus one context slot.
    """

    name: ClassVar[str] = "zsmerge"
    TRAITS: ClassVar[Traits] = Traits(state_fill={"scores": 0.0, "fusion": 1.0}, merges=True)

    proximity_ratio: float = 0.5
    residual_ratio: float = 0.02
    alpha: float = 1.0
    lam: float = 0.98
    window_size: int | None = 8
    pool_kernel: int = 5
    order: str = "code"

    def __post_init__(self) -> None:
        if self.proximity_ratio <= 0:
            raise ValueError(f"proximity_ratio must be > 0, got {self.proximity_ratio}")
        if self.residual_ratio < 0:
            raise ValueError(f"residual_ratio must be >= 0, got {self.residual_ratio}")
        for field in ("proximity_ratio", "residual_ratio"):  # >= 1 is a slot count, never rounded
            value = getattr(self, field)
            if value >= 1 and not float(value).is_integer():
                raise ValueError(
                    f"{field} must be a fraction below 1 or a whole slot count, got {value} "
                    f"(it would become {int(value)} slots)"
                )
        check_range(self, "alpha", "lam")
        if self.window_size is not None and self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if self.pool_kernel > 1 and self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be odd, got {self.pool_kernel}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")

    def split(self, budget: int) -> tuple[int, int, int]:
        """Tripartite budget ``(B_p, B_c, B_r)`` of Eq. 3 (App. C.2 allocation order).

        Raises
        ------
        ValueError
            If fewer than one context slot remains.
        """
        b_p = max(1, int(self.proximity_ratio * budget if self.proximity_ratio < 1 else self.proximity_ratio))
        if self.residual_ratio == 0:
            b_r = 0
        elif self.residual_ratio < 1:
            b_r = max(1, int(self.residual_ratio * (budget - b_p)))
        else:
            b_r = int(self.residual_ratio)
        b_c = budget - b_p - b_r
        if b_c < 1:
            raise ValueError(
                f"ZSMerge budget of {budget} slots leaves no context slot (B_p={b_p}, B_r={b_r})"
            )
        return b_p, b_c, b_r

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The contract's plan with :meth:`split` of the budget (``plan.split``; the prompt's when the
        method is prompt-only)."""
        plan = super().plan(layer)
        return plan if plan.keep is None else replace(plan, split=self.split(plan.keep))

    @cached_property
    def traits(self) -> Traits:
        """The declared traits with ``score_decay = lam``: Eq. 5, ``s <- lambda s + a``, fused into
        the decode attention."""
        return self.with_decode_budget(replace(self.TRAITS, score_decay=self.lam))

    # ------------------------------------------------------------------ prefill
    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Initialise scores from the observation window, then keep P + top-B_c and merge the rest.

        The leftover prompt tokens, in position order, are split into ``B_r`` contiguous groups of
        near-equal size and each group is averaged into one residual slot (fusion count = group
        size, score = max of its members), as the official code's ``cache_init`` does.
        """
        length = layer.store.n_slots
        window = length if self.window_size is None else min(self.window_size, length)
        decay = self.lam ** torch.arange(window - 1, -1, -1, device=query.device, dtype=torch.float32)
        if self.window_size is None:
            scores = causal_column_sums(
                query, layer.keys, scaling, row_weights=decay, softcap=layer.spec.softcap
            )
        else:
            probs = window_attention(query, layer.keys, window, scaling, layer.spec.softcap)
            scores = (probs * decay[:, None]).sum(dim=2)
        scores = pool_scores(scores, self.pool_kernel)
        layer.store.write("scores", scores)
        layer.scalars["residual"] = 0
        if layer.plan.fits(length):
            return
        b_p, b_c, b_r = layer.plan.split
        kept = keep_index(scores, 0, b_c, b_p)
        leftover = self._leftover(kept[..., :b_c], length - b_p)
        residual = self._residual_slots(layer, leftover, b_r) if b_r else None
        layer.store.keep(kept)
        if residual is not None:  # residual slots first, then the kept tokens
            keys, values, fusion, res_scores = residual
            layer.store.reset(
                keys=torch.cat([keys, layer.keys], dim=2),
                values=torch.cat([values, layer.values], dim=2),
                log_weight=torch.cat([self.alpha * fusion.log(), layer.store.log_weight], dim=-1),
                positions=torch.cat(
                    [torch.full_like(res_scores, -1, dtype=torch.long), layer.store.positions], -1
                ),
                scores=torch.cat([res_scores, layer.store.state["scores"]], dim=-1),
                fusion=torch.cat([fusion, layer.store.state["fusion"]], dim=-1),
            )
            layer.scalars["residual"] = b_r

    @staticmethod
    def _leftover(context: torch.Tensor, older: int) -> torch.Tensor:
        """Indices ``< older`` not in ``context`` ``[batch, kv_heads, B_c]``, ascending."""
        b, h, b_c = context.shape
        idx = torch.arange(older, device=context.device).expand(b, h, older)
        in_context = torch.zeros((b, h, older), dtype=torch.bool, device=context.device)
        in_context.scatter_(2, context, True)
        return torch.where(in_context, idx + older, idx).sort(dim=-1).values[..., : older - b_c]

    @staticmethod
    def _residual_slots(
        layer: CompressedLayer, leftover: torch.Tensor, b_r: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Average ``leftover`` ``[batch, kv_heads, n]`` into ``b_r`` contiguous groups.

        Returns keys, values ``[batch, kv_heads, b_r, head_dim]``, fusion counts and scores
        ``[batch, kv_heads, b_r]``.
        """
        b, h, n = leftover.shape
        group = torch.arange(n, device=leftover.device) * b_r // n
        counts = torch.bincount(group, minlength=b_r).to(torch.float32)

        def group_mean(t: torch.Tensor) -> torch.Tensor:
            acc = torch.promote_types(t.dtype, torch.float32)  # fp32 or better
            members = t.gather(2, leftover.unsqueeze(-1).expand(-1, -1, -1, t.shape[-1])).to(acc)
            sums = members.new_zeros((b, h, b_r, t.shape[-1])).index_add_(2, group, members)
            return (sums / counts[:, None].to(acc)).to(t.dtype)

        scores = layer.store.state["scores"].gather(2, leftover)
        res_scores = scores.new_zeros((b, h, b_r)).scatter_reduce_(
            2, group.expand(b, h, n), scores, "amax", include_self=False
        )
        return group_mean(layer.keys), group_mean(layer.values), counts.expand(b, h, b_r).clone(), res_scores

    # ------------------------------------------------------------------ decode
    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Eq. 5 score update (done by the decode attention when ``probs`` is None:
        :attr:`Traits.score_decay`), then one eviction: fill a residual slot or merge (Eqs. 6-7)."""
        if probs is not None:
            layer.store.write("scores", layer.store.state["scores"] * self.lam + probs)
        if layer.plan.bound is None:
            return
        b_p, b_c, b_r = layer.plan.split
        leaving = layer.tokens_seen() - 1 - b_p  # position of the token that just left the proximity window
        # One eviction per step once the cache is full; more only while a prompt that fit the budget
        # overflows B_p + B_c for the first time.
        while layer.store.n_slots - layer.scalars["residual"] > b_p + b_c:
            n_res = layer.scalars["residual"]
            pos = layer.store.positions
            candidates = (pos >= 0) & ((pos <= leaving) if self.order == "paper" else (pos < leaving))
            victim = lowest_score(layer.store.state["scores"], candidates)
            if n_res < b_r:
                self._to_residual(layer, victim, n_res)
                continue
            if b_r:
                self._merge(layer, victim, n_res)
            layer.store.drop(victim)

    @staticmethod
    def _to_residual(layer: CompressedLayer, victim: torch.Tensor, n_res: int) -> None:
        """Turn ``victim`` into residual slot ``n_res`` (swapped there in place), fusion count unchanged."""
        slot = torch.full_like(victim, n_res)
        layer.store.swap(victim, slot)
        layer.store.replace(slot.unsqueeze(-1), positions=-1)
        layer.scalars["residual"] = n_res + 1

    def _merge(self, layer: CompressedLayer, victim: torch.Tensor, n_res: int) -> None:
        """Merge slot ``victim`` ``[batch, kv_heads]`` into the residual slot of max key dot product.

        Eq. 6 picks the slot, Eq. 7 updates it by the incremental (fusion-weighted) mean of keys
        and values; the fusion count adds up, the slot's score becomes the max of both.
        """
        v_idx = victim[..., None]
        k_i = gather_slots(layer.keys, v_idx)
        dots = torch.matmul(layer.keys[:, :, :n_res].float(), k_i.float().transpose(-1, -2)).squeeze(-1)
        j_idx = dots.argmax(dim=-1, keepdim=True)
        fusion, scores = layer.store.state["fusion"], layer.store.state["scores"]
        w_i, w_j = fusion.gather(2, v_idx), fusion.gather(2, j_idx)
        total = w_i + w_j
        best = torch.maximum(scores.gather(2, j_idx), scores.gather(2, v_idx))
        layer.store.merge_into(j_idx, v_idx, w_j, w_i)
        layer.store.replace(j_idx, fusion=total, log_weight=self.alpha * total.log(), scores=best)
