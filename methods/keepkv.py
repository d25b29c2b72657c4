"""KeepKV: Electoral Votes + ZIP-Merging (Tian et al.; docs/methods.md s. 9).

Per layer and KV head (GQA: scores are the group mean of ``exp(logit)``):

- **Electoral Votes** (Eq. 6): every slot has a vote count ``p`` (1 for a token); decode attention
  is ``softmax(logit + ln p)``, held in ``log_weight``.
- **Score estimate** (Eq. 8): bias-corrected EMA ``s_hat = S / (1 - alpha^n)`` of the unnormalised
  scores ``s = exp(logit)``, initialised from the last ``w`` prompt queries and updated at every
  decode step, ``alpha = 1 - 2 / (w + 1)``; kept as ``ln S`` in float32 (log domain: no overflow,
  no rescaling). ``n`` counts the EMA terms (``w`` after prefill, +1 per step).
  ``estimator="window_mean"`` is the official code's estimator instead: the mean of ``exp(logit)``
  over the last ``w`` queries, and a selection score weighting those rows 1.0 -> 1.2.
- **Selection** (PyramidInfer, as in the official code): 4 attention sinks, a recent window of
  ``recent_share`` x the layer budget (also the EMA window ``w``), and the rest of the budget to
  the highest estimated attention ``p * s_hat``. ``layer_budgets="cosine"`` gives the official
  code's per-layer schedule (mean over layers = the budget; early layers get more).
- **Merging** (Algorithm 1): each evicted token goes to the retained token with the highest key
  cosine if it exceeds ``threshold`` (0.8), else it is dropped; the merge is ZIP-Merging (Eq. 7)
  with the estimated scores, with a guarded fallback to the convex average (counted as
  ``zip_fallbacks``). At prefill all evicted tokens are merged at once, several into one
  retained token when they pick the same partner (``methods.zip_merge``); at decode one token is
  evicted per step. ``merge="convex"`` is the official code's key/value convex average.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.base import CompressionMethod
from methods.keepkv_estimators import EMAEstimator, WindowMeanEstimator
from methods.layer import CompressedLayer, gather_slots, slot_index
from methods.scoring import complement, window_logits
from methods.zip_merge import merge_groups, merge_pair

NEG_INF = float("-inf")
#: ``estimator`` name -> its score-estimator object (``methods.keepkv_estimators``).
ESTIMATORS = {
    "ema": lambda method: EMAEstimator(method.alpha),
    "window_mean": lambda method: WindowMeanEstimator(method.distance_weight),
}


@functools.cache
def cosine_share(i: int, n: int, decay_ratio: float) -> float:
    """Layer ``i``'s heavy-hitter share under the official code's PyramidInfer cosine schedule
    (1.0 at layer 0 down to ``decay_ratio`` at layer ``n - 1``), normalised to mean 1 over layers.
    Cached: decode steps ask for it on every layer."""
    raw = [decay_ratio + (1 - decay_ratio) * (1 + math.cos(math.pi * j / (n - 1))) / 2 for j in range(n)]
    return raw[i] / (sum(raw) / n)


@dataclass
class KeepKV(CompressionMethod):
    """KeepKV with the paper's algorithm as defaults (``keepkv_code`` preset: the official code).

    Parameters
    ----------
    threshold : float
        Key cosine above which an evicted token is merged (T = 0.8), in [-1, 1]; 1 merges nothing
        (pure eviction).
    n_sink : int
        Attention sinks always kept (4).
    recent_share : float
        Recent window as a share of the layer budget (PyramidInfer recent ratio, 0.2).
    window : int | None
        Fixed recent window / EMA window (tokens) instead of ``recent_share``.
    alpha : float | None
        EMA decay; None: ``1 - 2 / (w + 1)`` (span of the code's window mean).
    estimator : str
        ``"ema"`` (Eq. 8) or ``"window_mean"`` (official code).
    merge : str
        ``"zip"`` (Eq. 7) or ``"convex"`` (official code).
    layer_budgets : str
        ``"uniform"`` or ``"cosine"`` (heavy share from 1.0 at layer 0 to ``decay_ratio`` at the
        last layer, rescaled so the mean over layers equals the budget).
    decay_ratio, distance_weight : float
        Cosine schedule floor (0.8); newest-row weight of the window-mean selection score (1.2).
    guard, max_factor : float
        ZIP fallback bounds (see :func:`methods.zip_merge.merge_groups`).

    Raises
    ------
    ValueError
        For an unknown estimator, merge or schedule, or out-of-range numbers.
    """

    name: ClassVar[str] = "keepkv"
    decode_input: ClassVar[str] = "logits"
    state_fill: ClassVar[dict[str, float]] = {"log_ema": NEG_INF, "rows": NEG_INF, "key_norm": 0.0}
    counters: ClassVar[tuple[str, ...]] = ("merges", "evictions", "zip_fallbacks")

    threshold: float = 0.8
    n_sink: int = 4
    recent_share: float = 0.2
    window: int | None = None
    alpha: float | None = None
    estimator: str = "ema"
    merge: str = "zip"
    layer_budgets: str = "uniform"
    decay_ratio: float = 0.8
    distance_weight: float = 1.2
    guard: float = 1e-3
    max_factor: float = 4.0
    scores: EMAEstimator | WindowMeanEstimator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        choices = {
            "estimator": tuple(ESTIMATORS),
            "merge": ("zip", "convex"),
            "layer_budgets": ("uniform", "cosine"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 <= self.recent_share < 1.0 or not 0.0 < self.decay_ratio <= 1.0:
            raise ValueError("recent_share must be in [0, 1) and decay_ratio in (0, 1]")
        if self.alpha is not None and not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {self.alpha}")
        if self.n_sink < 0 or (self.window is not None and self.window < 1):
            raise ValueError("n_sink must be >= 0 and window >= 1")
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold is a cosine similarity in [-1, 1], got {self.threshold}")
        if self.guard < 0:
            raise ValueError(f"guard must be >= 0, got {self.guard}")
        if self.max_factor <= 0:
            raise ValueError(
                f"max_factor must be > 0 (ZIP key factors lie in (0, max_factor]), got {self.max_factor}"
            )
        self.scores = ESTIMATORS[self.estimator](self)

    # ------------------------------------------------------------------ budgets
    def layer_budget(self, layer: CompressedLayer) -> tuple[int, int]:
        """``(slots, recent window)`` of this layer, both in tokens."""
        budget = layer.budget
        recent = math.ceil(self.recent_share * budget) if self.window is None else self.window
        recent = max(1, min(recent, budget - 1)) if budget > 1 else budget
        if self.layer_budgets == "cosine" and layer.num_layers > 1:
            heavy = (budget - recent) * cosine_share(layer.layer_idx, layer.num_layers, self.decay_ratio)
            budget = recent + max(1, round(heavy))
        return budget, recent

    def slot_bound(self, layer: CompressedLayer) -> int | None:
        """The layer's slots from :meth:`layer_budget` (cosine schedule included)."""
        return None if layer.budget is None else self.layer_budget(layer)[0]

    # ------------------------------------------------------------------ hooks
    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Initialise votes and score estimates from the last ``w`` prompt queries; compress."""
        length = layer.n_slots
        budget, recent = self.layer_budget(layer)
        window = max(1, min(recent, length))
        layer.meta.update(
            window=window, ema_terms=window, merges=0, evictions=0, zip_fallbacks=0, dropped_votes=0
        )
        logits = window_logits(query, layer.keys, window, scaling, layer.softcap)  # [b, h, g, w, L]
        log_s = torch.logsumexp(logits, dim=2) - math.log(logits.shape[2])  # group mean of exp(logit)
        self.scores.init(layer, log_s)
        layer.state["key_norm"] = layer.keys.float().norm(dim=-1)  # for the cosine of Algorithm 1
        if length > budget:
            self._compress(layer, budget, recent)

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Update score estimates with this step's logits ``[b, h, group, slots]``; evict/merge one."""
        self.scores.update(layer, torch.logsumexp(probs, dim=2) - math.log(probs.shape[2]))
        layer.state["key_norm"][..., -1] = layer.keys[:, :, -1].float().norm(dim=-1)
        budget, recent = self.layer_budget(layer)
        if layer.n_slots == budget + 1:
            self._evict_one(layer, budget, recent)
        elif layer.n_slots > budget:
            self._compress(layer, budget, recent)

    # ------------------------------------------------------------------ eviction + merging
    def _compress(self, layer: CompressedLayer, budget: int, recent: int) -> None:
        """Keep sinks + recent + top ``p * s_hat``; merge or drop the rest (Algorithm 1)."""
        n = layer.n_slots
        b, h = layer.keys.shape[:2]
        sink = min(self.n_sink, budget - recent)
        score = self.scores.select(layer)[..., sink : n - recent]
        top = score.topk(budget - recent - sink, dim=-1).indices + sink
        dev = layer.keys.device
        keep = torch.cat(
            [
                torch.arange(sink, device=dev).expand(b, h, sink),
                top,
                torch.arange(n - recent, n, device=dev).expand(b, h, recent),
            ],
            dim=-1,
        )
        keep = keep.sort(dim=-1).values
        evicted = complement(keep, n)

        k_unit = F.normalize(layer.keys.float(), dim=-1)
        cos = k_unit.gather(2, evicted.unsqueeze(-1).expand(-1, -1, -1, k_unit.shape[-1])) @ (
            k_unit.gather(2, keep.unsqueeze(-1).expand(-1, -1, -1, k_unit.shape[-1])).transpose(-1, -2)
        )
        best, partner = cos.max(dim=-1)  # [b, h, evicted]
        merge = best > self.threshold

        target = torch.empty((b, h, n), dtype=torch.long, device=keep.device)
        target.scatter_(2, keep, torch.arange(budget, device=keep.device).expand(b, h, budget))
        target.scatter_(2, evicted, partner)
        log_votes = layer.log_weight.clone()
        log_votes.scatter_(2, evicted, torch.where(merge, log_votes.gather(2, evicted), NEG_INF))
        log_score = self.scores.merge_score(layer)
        out = merge_groups(
            layer.keys,
            layer.values,
            log_votes,
            log_score,
            target,
            budget,
            zip_keys=self.merge == "zip",
            guard=self.guard,
            max_factor=self.max_factor,
        )

        state = {self.scores.state: self.scores.merged(layer, out.log_score, log_votes, target, budget)}
        layer.meta["merges"] += int(merge.sum())
        layer.meta["evictions"] += int((~merge).sum())
        layer.meta["zip_fallbacks"] += int(out.fallback.sum())
        dropped = layer.log_weight.gather(2, evicted).exp() * ~merge
        layer.meta["dropped_votes"] += round(float(dropped.sum()))
        layer.set_slots(
            out.keys.to(layer.keys.dtype),
            out.values.to(layer.values.dtype),
            out.log_votes.float(),
            layer.positions.gather(2, keep),
            state,
        )
        layer.state["key_norm"] = layer.keys.float().norm(dim=-1)

    def _evict_one(self, layer: CompressedLayer, budget: int, recent: int) -> None:
        """One decode-step eviction in place: the same choice and arithmetic as :meth:`_compress`
        with one slot over budget (its other groups are singletons, which merging leaves unchanged),
        but only the victim and its partner are touched; tokens are found by ``positions``."""
        pos = layer.positions
        sink = min(self.n_sink, budget - recent)
        middle = (pos >= sink) & (pos < layer.seen_tokens - recent)
        victim = torch.where(middle, self.scores.select(layer), torch.inf).argmin(dim=-1, keepdim=True)
        norm = layer.state["key_norm"].clamp(min=1e-12)  # as F.normalize
        k_victim = gather_slots(layer.keys, victim).float()
        cos = (layer.keys.float() @ k_victim.transpose(-1, -2)).squeeze(-1) / (norm * norm.gather(2, victim))
        best, partner = cos.scatter(2, victim, NEG_INF).max(dim=-1, keepdim=True)
        merge = best > self.threshold  # [b, h, 1]
        pair = torch.cat([partner, victim], dim=-1)  # [b, h, 2]: partner + (merged) victim
        log_votes = layer.log_weight.gather(2, pair)
        log_votes[..., 1:] = torch.where(merge, log_votes[..., 1:], NEG_INF)

        out = merge_pair(
            gather_slots(layer.keys, pair),
            gather_slots(layer.values, pair),
            log_votes,
            self.scores.merge_score(layer).gather(2, pair),
            zip_keys=self.merge == "zip",
            guard=self.guard,
            max_factor=self.max_factor,
        )
        new_state = self.scores.merged(layer, out.log_score, log_votes, torch.zeros_like(pair), 1, slots=pair)
        name = self.scores.state
        for t, new in (
            (layer.keys, out.keys),
            (layer.values, out.values),
            (layer.log_weight, out.log_votes),
            (layer.state[name], new_state),
        ):
            t.scatter_(2, slot_index(t, partner), new.to(t.dtype))
        layer.state["key_norm"].scatter_(2, partner, gather_slots(layer.keys, partner).float().norm(dim=-1))
        layer.meta["merges"] += merge.sum()  # device tensors: no host sync per step
        layer.meta["evictions"] += (~merge).sum()
        layer.meta["zip_fallbacks"] += out.fallback.sum()
        layer.meta["dropped_votes"] += (layer.log_weight.gather(2, victim).exp() * ~merge).sum()
        layer.drop(victim.squeeze(-1))
