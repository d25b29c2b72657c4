"""LagKV (Liang et al. 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
Important"; kvpress ``LagKVPress``; AI-Lab-China-Merchants-Bank/LagKV).

Attention-free. After ``n_sink`` sinks the tokens fall in partitions of ``lag_size`` by position; a
partition is scored once the next one (its lag reference) is complete: keys and values are min-max
normalised per channel with the reference's statistics, and each token's score is the softmax over
its partition of the channel standard deviation of its normalised key, averaged with that of its
value (Sec. 3). The paper keeps the top tokens of each partition; as kvpress (``cross_scoring=False``)
the score is the token's rank inside its partition, so a global top-k takes the same share of every
partition. Ties of rank between partitions go to the newer partition (score
``rank / L + partition * 2^-24``, ``L`` the lag rounded up to a power of two: exact in float32).
Tokens whose partition has no complete reference yet (the last full partition and the remainder),
and the sinks, score ``2 + position``: above every scored token (at most 1), oldest first among
themselves, so a budget below them keeps the newest (kvpress's short-prompt rule, a sliding window).
``ties="topk"`` (the ``lagkv_kvpress`` preset) selects the prompt's tokens as kvpress's ``ScorerPress``
does instead: ``torch.topk`` over kvpress's score vector (sinks and unscored tokens 1, scored ones
``rank / L`` in the keys' dtype; a short prompt ``(position - n_sink) / (n - n_sink)``), whose tie
order is the device's ``topk`` (on the CPU an introselect: neither the older nor the newer first), and
ranks exact score ties inside a partition by kvpress's unstable ``argsort`` (else the older ranks
lower), so on the same device and dtype the kept sets are kvpress's.

Decode: partitions stay aligned to positions (as the official code's recursive compression); the
step that completes a partition scores the one before it with the tokens of both still held, and
scores never change after that; each step evicts the lowest-scored unprotected token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan

BITS = 24  # float32 holds every integer below 2^24
TAIL = 2.0  # unscored tokens score TAIL + position; scored ones at most 1


def lag_std(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Std over ``head_dim`` of ``x`` ``[..., head_dim]`` min-max normalised by the reference's
    per-channel ``low``, ``high`` (a constant channel spans 1): ``[...]`` float32."""
    span = high - low
    return ((x.float() - low) / torch.where(span > 0, span, 1.0)).std(dim=-1)


@dataclass
class LagKV(ScoreEvict):
    """LagKV: per KV head, keep the tokens that stand out against the next ``lag_size`` tokens.

    Parameters
    ----------
    n_sink : int
        First tokens always kept (4, kvpress).
    lag_size : int
        Partition size ``L`` in tokens (128, kvpress).
    cross_scoring : bool
        Rank by the softmax scores themselves, so partitions compete (kvpress's experimental
        option, for head-adaptive budgets); False: by rank inside each partition (the paper).
    ties : str
        The prefill selection's tie order: ``"newer"`` (rank ties between partitions keep the newer
        partition; sinks and unscored tokens kept first, the oldest of them evicted first) or
        ``"topk"`` (kvpress ``LagKVPress``: ``torch.topk`` over kvpress's score vector, exact ties
        inside a partition ranked by the unstable ``argsort``; module docstring). Decoding is the same
        for both.

    Raises
    ------
    ValueError
        For ``n_sink`` < 0, ``lag_size`` < 2 or ``ties`` not in ``("newer", "topk")``.
    """

    name: ClassVar[str] = "lagkv"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, decode_input="none")

    n_sink: int = 4
    lag_size: int = 128
    cross_scoring: bool = False
    ties: str = "newer"

    def __post_init__(self) -> None:
        if self.ties not in ("newer", "topk"):
            raise ValueError(f"ties must be 'newer' or 'topk', got {self.ties!r}")
        if self.n_sink < 0:
            raise ValueError(f"n_sink must be >= 0, got {self.n_sink}")
        if self.lag_size < 2:
            raise ValueError(f"lag_size must be >= 2, got {self.lag_size}")

    @property
    def per_rank(self) -> int:
        """Partitions one rank step spans in the rank code: ``2^24 / L`` (``L`` rounded up to 2^k)."""
        return 2 ** (BITS - (self.lag_size - 1).bit_length())

    def protected(self, bound: int) -> tuple[int, int]:
        """The ``n_sink`` sinks (at most ``bound - 1``, so the newest token has a slot)."""
        return max(0, min(self.n_sink, bound - 1)), 0

    def partition_scores(self, score: torch.Tensor, rank: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        """The stored score of scored tokens: the softmax score, or the rank code ``(rank * P +
        partition) / 2^24`` (``P`` = :attr:`per_rank`; partitions past ``P - 1`` tie)."""
        if self.cross_scoring:
            return score
        code = rank * self.per_rank + part.clamp(max=self.per_rank - 1)
        return code.float() / 2.0**BITS

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """Scores ``[batch, kv_heads, prompt]`` of the prompt (held in position order): partitions
        ``0 .. M - 2`` against their successors, ``M`` full partitions after the sinks."""
        out = layer.store.positions.float() + TAIL
        b, h, length, d = layer.keys.shape
        lag = self.lag_size
        parts = max(length - self.n_sink, 0) // lag
        if parts < 2:
            return out
        span = slice(self.n_sink, self.n_sink + parts * lag)
        score = 0.0
        for x in (layer.keys, layer.values):
            x = x[:, :, span].reshape(b, h, parts, lag, d)
            low, high = x[:, :, 1:].amin(dim=3, keepdim=True), x[:, :, 1:].amax(dim=3, keepdim=True)
            score = score + torch.softmax(lag_std(x[:, :, :-1], low, high), dim=-1) / 2
        rank = score.argsort(dim=-1, stable=self.ties == "newer").argsort(dim=-1)  # exact ties: see ties
        part = torch.arange(parts - 1, device=out.device).view(1, 1, -1, 1).expand_as(rank)
        scored = self.partition_scores(score, rank, part).reshape(b, h, -1)
        out[:, :, self.n_sink : self.n_sink + (parts - 1) * lag] = scored
        return out

    def kvpress_scores(self, layer: CompressedLayer) -> torch.Tensor:
        """kvpress ``LagKVPress.score`` of the prompt ``[batch, kv_heads, prompt]`` in the keys' dtype,
        read off the stored scores (held in position order): sinks and unscored tokens 1, a scored
        token ``rank / L`` (its rank decoded from the rank code) or its softmax score
        (``cross_scoring``); a prompt of under two partitions ``(position - n_sink) / (n - n_sink)``
        after the sinks (kvpress's short-prompt rule)."""
        stored, pos = layer.store.state["scores"], layer.store.positions
        n, dtype, one = stored.shape[-1], layer.keys.dtype, torch.ones((), dtype=layer.keys.dtype)
        if (n - self.n_sink) // self.lag_size < 2:
            slide = ((pos - self.n_sink) / max(n - self.n_sink, 1)).to(dtype)
            return torch.where(pos < self.n_sink, one, slide)
        if self.cross_scoring:
            scored = stored
        else:
            code = (stored * 2.0**BITS).long()
            scored = torch.div(code, self.per_rank, rounding_mode="floor") / self.lag_size
        return torch.where(stored < TAIL, scored.to(dtype), one)

    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """:meth:`ScoreEvict.prefill_keep`, or with ``ties="topk"`` kvpress's selection: the
        ``layer.plan.keep`` slots of ``torch.topk`` over :meth:`kvpress_scores` ``[batch, kv_heads,
        keep]`` (ascending), or None when the prompt fits."""
        if self.ties == "newer":
            return super().prefill_keep(layer, query, scaling)
        layer.store.write("scores", self.prefill_scores(layer, query, scaling))
        plan: LayerPlan = layer.plan
        if plan.fits(layer.store.n_slots):
            return None
        return self.kvpress_scores(layer).topk(plan.keep, dim=-1).indices.sort(dim=-1).values

    def step_scores(self, layer: CompressedLayer, probs: None) -> torch.Tensor:
        """The stored scores, the newest token's ``2 + position``, and the partition whose
        reference completes at this step scored against the reference's held tokens."""
        pos, stored = layer.store.positions, layer.store.state["scores"]
        full = (layer.tokens_seen() - self.n_sink) // self.lag_size  # complete partitions (-1: none)
        part = torch.div(pos - self.n_sink, self.lag_size, rounding_mode="floor")
        body = pos >= self.n_sink
        target = body & (part == full - 2) & (stored >= TAIL)  # nonempty only when ``full`` just grew
        ref = (body & (part == full - 1))[..., None]
        score = 0.0
        for x in (layer.keys, layer.values):
            low = x.masked_fill(~ref, float("inf")).amin(dim=2, keepdim=True).float()
            high = x.masked_fill(~ref, float("-inf")).amax(dim=2, keepdim=True).float()
            std = lag_std(x, low, high).masked_fill(~target, float("-inf"))
            score = score + torch.softmax(std, dim=-1) / 2
        rank = score.masked_fill(~target, float("inf")).argsort(dim=-1, stable=True).argsort(dim=-1)
        scores = torch.where(target, self.partition_scores(score, rank, part), stored)
        return torch.where(body & (part < full - 1), scores, pos.float() + TAIL)
