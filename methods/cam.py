"""CaM (Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference", ICML 2024; kvpress 0.5.5
``CAMPress``, ``cam_press.py``): while decoding, the values of evicted tokens are merged into the kept
tokens that follow them, each merge drawn from a Bernoulli.

Every query counts as a step: the prompt's last query (the one that gives the first new token, as
kvpress's question pass) and each decoded token's. Per layer:

1. **Cumulative attention** ``A`` (state ``attn``): each step adds its query's attention, averaged
   over the query heads of a KV group; a slot starts at 0 (the prompt at its last query).
2. **When**: once ``compression_interval`` steps have passed since the last compression (or the
   prompt) and the layer holds more than the budget ``T`` (kvpress's ``target_size``).
3. **Which**: the scorer's scores averaged over the KV heads: the lowest ``n - T`` are evicted, the
   same tokens in every head (:func:`cam_selection`). The ``s`` best-scored evicted ones merge (``s``:
   the steps since the last compression; ties: the later token first).
4. **Merge** (:func:`cam_merge`): a merging token ``i``'s window is the next ``merge_budget`` kept
   tokens after it (fewer at the end: ``c_i``); ``p_i = clamp(A_i / mean_window(A), 0, 1)`` (0/0: 0,
   x/0: 1), per head; ``m_i ~ Bernoulli(p_i)`` (``seed``: ``u < p_i`` with ``u`` a counter-based draw
   of the seed, layer, tokens seen, head and token, :func:`keyed_uniform`: reproducible, the same for
   a row batched or alone, no generator state; ``seed=null``: torch's global generator, kvpress's); every
   window token's value gains ``m_i v_i / c_i``. The evicted slots are then freed.

With ``compression_interval`` 1 (the paper's per-step CaM; this preset) the layer holds the budget
after the prompt's step and at every decode step; larger intervals (kvpress's batched variant, default
512) let the layer grow by ``interval - 1`` slots between compressions, and keep a prompt whole until
the first one. The layer's slots stay in position order (prompt order, appends at the end, kept
sets sorted), which lines them up across heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.knorm import KNorm
from methods.scoring import window_attention
from methods.seam.contract import CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.slots import gather_slots
from methods.wrap import ScorerWrapper

MODULUS = 2**31 - 1  # MINSTD (Park-Miller): products stay below 2**62 in int64


def keyed_uniform(*keys: torch.Tensor | int, rounds: int = 3) -> torch.Tensor:
    """Draws in ``(0, 1)`` float64, one per element of the broadcast ``keys`` (integers >= 0): each key
    folded into a MINSTD state (``x <- (48271 x + key + 1) mod (2^31 - 1)``, then ``rounds`` plain
    steps). Counter-based: the same keys give the same draw on any device, in any batch, compiled or
    not."""
    x = torch.zeros((), dtype=torch.long)
    for key in keys:
        x = (x * 48271 + key + 1) % MODULUS
        for _ in range(rounds):
            x = x * 48271 % MODULUS
    return x.double() / MODULUS


def cam_selection(scores: torch.Tensor, target: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kvpress ``CAMPress``'s selection from ``scores`` ``[batch, kv_heads, slots]`` (slots in
    position order, ``slots > target``), the same for every head.

    Returns ``(kept, merging)``: ``[batch, target]`` the top ``target`` of the head-mean scores and
    ``[batch, min(steps, slots - target)]`` the best-scored of the ``slots - target`` lowest (ties: the
    later slot first); both int64, ascending.
    """
    mean = scores.float().mean(dim=1)
    n = mean.shape[-1]
    evicted = mean.topk(n - target, dim=-1, largest=False).indices.sort(dim=-1).values
    latest_first = evicted.flip(-1)
    rank = mean.gather(-1, latest_first).sort(dim=-1, descending=True, stable=True).indices
    merging = latest_first.gather(-1, rank[:, :steps]).sort(dim=-1).values
    kept = mean.topk(target, dim=-1).indices.sort(dim=-1).values
    return kept, merging


def cam_merge(
    values: torch.Tensor,
    attn: torch.Tensor,
    kept: torch.Tensor,
    merging: torch.Tensor,
    merge_budget: int,
    draws: torch.Tensor | None = None,
) -> torch.Tensor:
    """CaM's merge (module docstring, step 4) of the slots ``merging`` into the windows of ``kept``.

    Parameters
    ----------
    values : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``.
    attn : torch.Tensor
        ``[batch, kv_heads, slots]`` cumulative attention.
    kept, merging : torch.Tensor
        ``[batch, k]`` and ``[batch, m]`` int64 slots, ascending (:func:`cam_selection`).
    merge_budget : int
        Kept tokens in a window.
    draws : torch.Tensor | None
        ``[batch, kv_heads, m]`` uniform draws: a merge where ``draw < p``; None: ``torch.bernoulli`` of
        the probabilities, torch's global generator (kvpress).

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, slots, head_dim]``: ``values`` with the merges added (float32 sums, in
        ``values``' dtype).
    """
    b, h = attn.shape[:2]
    k, m = kept.shape[-1], merging.shape[-1]
    window = torch.searchsorted(kept, merging, right=True)[..., None] + torch.arange(
        merge_budget, device=kept.device
    )  # [batch, m, budget]: indices into kept
    valid = window < k
    targets = kept.gather(1, window.clamp(max=k - 1).flatten(1))  # [batch, m * budget] slots
    count = valid.sum(-1)  # [batch, m]
    window_attn = attn.gather(2, targets[:, None].expand(b, h, -1)).view(b, h, m, merge_budget)
    mean = (window_attn * valid[:, None]).sum(-1) / count.clamp(min=1)[:, None]
    prob = attn.gather(2, merging[:, None].expand(b, h, m)) / mean
    prob = torch.nan_to_num(prob, nan=0.0, posinf=1.0).clamp(0, 1)
    mask = torch.bernoulli(prob) if draws is None else (draws < prob).to(prob.dtype)
    share = torch.where(count[:, None] > 0, mask / count[:, None], 0.0)  # [batch, kv_heads, m]
    own = gather_slots(values, merging[:, None].expand(b, h, m)).float()
    add = (own * share[..., None])[:, :, :, None] * valid[:, None, :, :, None]  # [b, h, m, budget, d]
    d = values.shape[-1]
    out = values.float().clone()
    out.scatter_add_(2, targets[:, None, :, None].expand(b, h, -1, d), add.reshape(b, h, m * merge_budget, d))
    return out.to(values.dtype)


@dataclass
class CAM(ScorerWrapper):
    """CaM over a scorer (module docstring; kvpress's ``CAMPress``).

    Parameters
    ----------
    scorer : ScoreEvict
        Scores the tokens at a compression (kvpress has no default base press; KNorm here). Its own
        prefill and decode-step scores are used (kvpress re-scores from buffered hidden states: the same
        for KNorm).
    compression_interval : int
        Steps between compressions (kvpress: 512; 1, the paper's per-step rule, here).
    merge_budget : int
        Kept tokens each merging value is spread over (kvpress: 32).
    seed : int | None
        Keys the merge draws (:func:`keyed_uniform`); None: torch's global generator, unseeded unless
        the caller seeds it (kvpress; ``scripts/kvpress_cam_tokens.py``).

    Raises
    ------
    ValueError
        For an interval or merge budget < 1, or a scorer that ranks no tokens or reads logits.
    """

    name: ClassVar[str] = "cam"
    PAPER_SCORER: ClassVar[str] = "knorm"  # the preset's (kvpress has no default): named ``cam``

    scorer: ScoreEvict = field(default_factory=KNorm)
    compression_interval: int = 1
    merge_budget: int = 32
    seed: int | None = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression_interval < 1 or self.merge_budget < 1:
            raise ValueError(
                f"compression_interval and merge_budget must be >= 1, got "
                f"{self.compression_interval}, {self.merge_budget}"
            )
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0 or null, got {self.seed}")
        if self.scorer.traits.decode_input == "logits":
            raise ValueError(f"cam hands its scorer probabilities; {self.scorer.label} reads logits")

    @cached_property
    def traits(self) -> Traits:
        """The scorer's state plus ``scores`` and ``attn``; decode steps get probabilities."""
        fills = {**self.scorer.traits.state_fill, "scores": 0.0, "attn": 0.0}
        base = Traits(state_fill=fills, decode_input="probs", uses_log_weight=False)
        return self.with_decode_budget(base)

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """``keep`` = the budget ``T``; bound ``T + interval - 1`` (None when prompt-only)."""
        budget = layer.budget
        if budget is None:
            return LayerPlan()
        bound = None if self.traits.prompt_only else budget + self.compression_interval - 1
        return LayerPlan(bound=bound, keep=budget)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """The prompt's last query as the first step: its attention starts ``attn``, the scorer scores
        the prompt, and the layer compresses if due (:meth:`compress`)."""
        scores = self.scorer.prefill_scores(layer, query, scaling)
        if scores is not None:
            layer.store.write("scores", scores.float())
        last = window_attention(query, layer.keys, 1, scaling, layer.spec.softcap)[:, :, -1]
        layer.store.write("attn", last)
        layer.scalars["cam_steps"] = 1
        self.compress(layer)

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Add this step's attention ``probs`` ``[batch, kv_heads, slots]`` to ``attn``, update the
        scorer's scores, compress if due."""
        scores = self.scorer.step_scores(layer, probs)
        if scores is not None:
            layer.store.write("scores", scores.float())
        layer.store.write("attn", layer.store.state["attn"] + probs)
        if self.compression_interval > 1:  # interval 1: a compression is due whenever over the budget
            layer.scalars["cam_steps"] += 1
        self.compress(layer)

    def compress(self, layer: CompressedLayer) -> None:
        """Merge and evict down to ``plan.keep`` once ``compression_interval`` steps have passed and
        the layer holds more (:func:`cam_selection`, :func:`cam_merge`). With interval 1 one token
        merges (a step since the last compression; the prompt's step is one); host integers are then
        the slot count alone, constant once the layer is full (compiled steps)."""
        store, target = layer.store, layer.plan.keep
        if target is None or store.n_slots <= target:
            return
        merges = 1
        if self.compression_interval > 1:
            merges = layer.scalars["cam_steps"]
            if merges < self.compression_interval:
                return
            layer.scalars["cam_steps"] = 0
        kept, merging = cam_selection(store.state["scores"], target, merges)
        draws = None
        if self.seed is not None:
            h = store.positions.shape[1]
            token = store.positions[:, :1].gather(2, merging[:, None]).clamp(min=0)  # [batch, 1, m]
            head = torch.arange(h, device=token.device)[:, None]
            draws = keyed_uniform(self.seed, layer.spec.layer_idx, layer.tokens_seen(), head, token)
        values = cam_merge(store.values, store.state["attn"], kept, merging, self.merge_budget, draws)
        index = kept[:, None].expand(*store.positions.shape[:2], target).contiguous()
        store.keep(index)
        store.write("values", gather_slots(values, index))

    decode_attention = CompressionMethod.decode_attention
