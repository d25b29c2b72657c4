"""KVCompose (Akulov et al. 2025, "KVCompose: Efficient Structured KV Cache Compression with
Composite Tokens", arXiv:2509.05165; kvpress ``KVComposePress``, ``kvcompose_press.py``): attention-
guided composite tokens with a budget shared across layers.

After the prefill the model reads its prompt once more, fed at the positions that follow it against
the cached prompt (``methods.probing``; kvpress runs the same second forward with the prompt as its
"question"). A query head scores each cached token by the largest attention any of those queries gives
it (``agg_task``); a KV head's score is its group's mean (``agg_group``), plus the layer's mean over its
KV heads (``add_mean_across_heads``). Each head sorts its own scores: its i-th best token is the head's
part of the layer's i-th *composite token*, scored by the mean of the heads' i-th best scores
(``agg_head``); the first layer's composites take the maximum over all layers. The top
``int(layers x prompt x share)`` composites over all layers give each layer its count (at least one),
and every head of the layer keeps that many of its own best tokens: the same count in every head
(uniform tensors) at positions that differ per head. ``structured=false`` (kvpress's unstructured
variant) ranks every head's sorted scores over all layers and heads instead: heads keep their own
counts, packed ragged (kvpress masks; here the memory is freed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

import torch

from kernels.prefill import group_queries, grouped_logits, logits_buffer
from methods.checks import option
from methods.probing import Probe, Probing
from methods.scoring import mask_future_block_
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.traits import NO_DECODE_RULE, Traits

AGGREGATORS = ("max", "mean")


def aggregate(x: torch.Tensor, how: str, dim: int) -> torch.Tensor:
    """``x`` reduced over ``dim`` by ``how`` (``"max"`` or ``"mean"``); the mean as kvpress's
    ``MeanAggregator`` forms it: the slices added one after another, then divided by their count."""
    if how == "max":
        return x.amax(dim)
    total = torch.zeros_like(x.select(dim, 0))
    for part in x.unbind(dim):
        total = total + part
    return total / x.shape[dim]


def composite_counts(
    scores: torch.Tensor, total: int, structured: bool = True, agg_head: str = "mean", lower_bound: int = 0
) -> torch.Tensor:
    """How many tokens each (layer, KV head) keeps (kvpress ``compute_important_per_layer``).

    Parameters
    ----------
    scores : torch.Tensor
        ``[batch, layers, kv_heads, prompt]`` token scores (higher: keep).
    total : int
        Composite tokens kept over all layers (structured), or tokens over all layers and heads.
    structured : bool
        True: composites (each head's scores sorted, aggregated over the heads by ``agg_head``, the
        first layer's the maximum over the layers) ranked over the layers, every layer at least
        ``max(1, lower_bound)``; False: every head's sorted scores ranked over layers and heads.
    agg_head : str
        ``"mean"`` or ``"max"`` over the heads' i-th best scores.
    lower_bound : int
        The first ``lower_bound`` composites (or sorted head scores) of every layer (head) ranked first.

    Returns
    -------
    torch.Tensor
        ``[batch, layers, kv_heads]`` int64 counts (the same in every head of a layer when
        ``structured``; an unstructured head may get 0).
    """
    b, layers, heads, n = scores.shape
    ranked = scores.sort(dim=-1, descending=True).values
    if structured:
        ranked = aggregate(ranked, agg_head, dim=2)  # [b, layers, n]: the composites
    ranked[..., :lower_bound] += 1e9
    if structured:
        ranked[:, 0] = ranked.amax(dim=1)
    units = layers if structured else layers * heads
    chosen = ranked.reshape(b, -1).topk(total, dim=-1).indices // n
    counts = torch.stack([torch.bincount(row, minlength=units) for row in chosen])
    if structured:
        return counts.clamp(min=max(1, lower_bound))[:, :, None].expand(b, layers, heads)
    return counts.view(b, layers, heads)


def composite_keep(scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[batch, layers, kv_heads, prompt]`` bool: each head's ``counts`` ``[batch, layers, kv_heads]``
    best tokens of ``scores`` (same shape), in kvpress's order (``argsort``, descending)."""
    order = scores.argsort(dim=-1, descending=True)
    ranks = torch.arange(scores.shape[-1], device=scores.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, ranks)
    return rank < counts[..., None]


@dataclass
class KVCompose(Probing, CompressionMethod):
    """KVCompose with kvpress's defaults (module docstring).

    Parameters
    ----------
    structured : bool
        True: composite tokens, one count per layer; False: one count per (layer, KV head), ragged.
    agg_task : str
        ``"max"`` or ``"mean"``: a query head's score of a token over the re-read prompt's queries.
    agg_group : str
        ``"mean"`` or ``"max"`` over the query heads of a KV group.
    agg_head : str
        ``"mean"`` or ``"max"`` over the KV heads' i-th best scores (a composite's score).
    add_v_norm : bool
        Scores times the token's value norm ``||v||_2`` (kvpress 0.5.5 fails with it: its cache then
        holds the prompt twice).
    add_mean_across_heads : bool
        Scores plus their mean over the layer's KV heads.
    keep_token_lower_bound : int
        Composites (tokens of each head, unstructured) every layer keeps at least.
    block : int
        Re-read queries per block (memory ``O(block x 2 prompt)`` per head; not results).

    Raises
    ------
    ValueError
        For an aggregator outside ``("max", "mean")``, ``keep_token_lower_bound`` < 0 or ``block`` < 1.
    """

    name: ClassVar[str] = "kvcompose"
    TRAITS: ClassVar[Traits] = replace(
        NO_DECODE_RULE, prompt_only=True, probes=True, state_fill={"scores": 0.0}
    )

    #: the layers share one budget (as KVzip's ``layerwise=false``): a layer may hold more than the run's
    #: budget, the model as a whole does not (up to the one token a layer keeps at least)
    layerwise: ClassVar[bool] = False

    structured: bool = True
    agg_task: str = "max"
    agg_group: str = "mean"
    agg_head: str = "mean"
    add_v_norm: bool = False
    add_mean_across_heads: bool = True
    keep_token_lower_bound: int = option(0, low=0, high="max_context")
    block: int = option(256, low=1)

    def __post_init__(self) -> None:
        for field in ("agg_task", "agg_group", "agg_head"):
            if getattr(self, field) not in AGGREGATORS:
                raise ValueError(f"{field} must be one of {AGGREGATORS}, got {getattr(self, field)!r}")
        if self.keep_token_lower_bound < 0 or self.block < 1:
            raise ValueError(
                f"need keep_token_lower_bound >= 0 and block >= 1, got {self.keep_token_lower_bound}, "
                f"{self.block}"
            )

    @cached_property
    def traits(self) -> Traits:
        """:attr:`TRAITS`; heads of their own counts (ragged) when not ``structured``."""
        return self.with_decode_budget(replace(self.TRAITS, ragged_heads=not self.structured))

    def probe_prompts(self, input_ids: torch.Tensor) -> list[Probe]:
        """The prompt ``[batch, prompt]`` itself, read once more after it."""
        return [Probe(input_ids, (0, input_ids.shape[1]))]

    def probe(
        self,
        layer: CompressedLayer,
        query: torch.Tensor,
        keys: torch.Tensor,
        scaling: float,
        probe: Probe,
        hidden_norm: torch.Tensor | None = None,
    ) -> None:
        """Score the layer's prompt from the re-read's ``query`` ``[batch, q_heads, prompt, head_dim]``
        and ``keys`` ``[batch, kv_heads, prompt, head_dim]`` (post-RoPE): each query head's softmax over
        the cached prompt and the re-read's causal part, reduced over the queries (``agg_task``) and the
        group (``agg_group``), times ``||v||`` (``add_v_norm``), plus the heads' mean; written to the
        ``scores`` field ``[batch, kv_heads, prompt]`` float32."""
        hkv, n, m = keys.shape[1], layer.store.n_slots, keys.shape[2]
        every = torch.cat([layer.keys, keys], dim=2).float()
        buffer = logits_buffer(query, min(self.block, m), n + m)  # every block's logits
        best = None
        for a in range(0, m, self.block):
            last = min(a + self.block, m)
            q = group_queries(query[:, :, a:last], hkv).float()
            logits = grouped_logits(q, every[:, :, : n + last], scaling, layer.spec.softcap, out=buffer)
            mask_future_block_(logits, n + a)  # the re-read's own keys after each query
            probs = torch.softmax(logits, dim=-1, out=logits)[..., :n]  # [b, hkv, group, block, prompt]
            part = probs.amax(3) if self.agg_task == "max" else probs.sum(3)
            if best is None:
                best = part
            elif self.agg_task == "max":
                best = torch.maximum(best, part)
            else:
                best = best + part
        if self.agg_task == "mean":
            best = best / m
        scores = aggregate(best, self.agg_group, dim=2)  # [b, hkv, prompt]
        if self.add_v_norm:
            scores = scores * layer.values.float().norm(dim=-1)
        if self.add_mean_across_heads:
            scores = scores + scores.mean(dim=1, keepdim=True)
        layer.store.write("scores", scores)

    def compress(self, layers: list[CompressedLayer]) -> None:
        """The counts of :func:`composite_counts` over the layers' budget (``int(units x prompt x
        share)``, kvpress's ``compute_n_kept``; ``units`` the layers, or their heads unstructured), then
        each head's best tokens (:func:`composite_keep`): the uniform layer's ``keep``, or ragged heads
        (unstructured, or batch rows whose counts differ). An unstructured head that gets no token keeps
        its best one (a ragged head holds at least one slot)."""
        layers = [lay for lay in layers if lay.plan is not None and lay.plan.keep is not None]
        if not layers:
            return
        first = layers[0]
        b, heads, n = first.store.state["scores"].shape
        units = len(layers) * (1 if self.structured else heads)
        if first.share is not None:
            total = max(1, int(units * n * first.share))
        else:
            total = units * min(first.plan.keep, n)
        if total >= units * n:
            return
        scores = torch.stack([lay.store.state["scores"] for lay in layers], dim=1)  # [b, L, H, n]
        counts = composite_counts(scores, total, self.structured, self.agg_head, self.keep_token_lower_bound)
        keep = composite_keep(scores, counts.clamp(min=1))
        for i, layer in enumerate(layers):
            if self.structured and bool((counts[:, i] == counts[0, i, 0]).all()):
                index = keep[:, i].nonzero()[:, -1].view(b, heads, -1)  # slot order = position order
                layer.store.keep(index)
            else:
                layer.store = layer.store.ragged(keep[:, i])
