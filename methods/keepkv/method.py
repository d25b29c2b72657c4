"""KeepKV: Electoral Votes + ZIP-Merging (Tian et al.; docs/methods.md, "KeepKV").

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
  retained token when they pick the same partner (``methods.keepkv.zip_merge``); at decode one token is
  evicted per step. ``merge="convex"`` is the official code's key/value convex average.

The selection is a score-then-evict rule (``methods.evict``: sinks and recent window protected,
ranked by ``p * s_hat``); :meth:`KeepKV.merge_evicted` is the one merge path of prefill and decode.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.keepkv.estimators import EMAEstimator, WindowMeanEstimator
from methods.keepkv.partners import cosine_partners
from methods.keepkv.zip_merge import MergeGroups, merge_groups, small_logsumexp
from methods.scoring import complement, window_logits
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.slots import slot_index

NEG_INF = float("-inf")
#: ``estimator`` name -> its score-estimator object (``methods.keepkv.estimators``).
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
class KeepKV(ScoreEvict):
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
        ZIP fallback bounds (see :func:`methods.keepkv.zip_merge.merge_groups`).

    Raises
    ------
    ValueError
        For an unknown estimator, merge or schedule, or out-of-range numbers.
    """

    name: ClassVar[str] = "keepkv"
    TRAITS: ClassVar[Traits] = Traits(
        decode_input="logits", counters=("merges", "evictions", "zip_fallbacks"), merges=True
    )

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
        if not 0 < self.max_factor < math.inf:
            raise ValueError(
                "max_factor must be finite and > 0 (ZIP key factors lie in (0, max_factor]), "
                f"got {self.max_factor}"
            )
        self.scores = ESTIMATORS[self.estimator](self)

    @cached_property
    def traits(self) -> Traits:
        """The declared traits with the estimator's state (``log_ema`` or ``rows``), empty until
        prefill: ``-inf``."""
        return self.with_decode_budget(replace(self.TRAITS, state_fill={self.scores.state: NEG_INF}))

    # ------------------------------------------------------------------ budgets
    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """This layer's slots (cosine schedule included) and recent window, both in tokens; the
        attention sinks (at most the budget left by the recent window) protected besides."""
        budget = layer.budget if self.traits.compresses else None
        if budget is None:
            return LayerPlan()
        recent = math.ceil(self.recent_share * budget) if self.window is None else self.window
        recent = max(1, min(recent, budget - 1)) if budget > 1 else budget
        if self.layer_budgets == "cosine" and layer.spec.num_layers > 1:
            heavy = (budget - recent) * cosine_share(
                layer.spec.layer_idx, layer.spec.num_layers, self.decay_ratio
            )
            budget = recent + max(1, round(heavy))
        bound = None if self.traits.prompt_only else budget
        return LayerPlan(bound=bound, keep=budget, first=min(self.n_sink, budget - recent), recent=recent)

    def ranking(self, layer: CompressedLayer) -> torch.Tensor:
        """``ln(p * s_hat)`` (the estimator's selection score)."""
        return self.scores.select(layer)

    # ------------------------------------------------------------------ hooks
    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Initialise votes and score estimates from the last ``w`` prompt queries; compress."""
        length = layer.store.n_slots
        window = max(1, min(layer.plan.recent, length))
        b, h = layer.keys.shape[:2]
        device = layer.keys.device
        for name in (
            *self.traits.counters,
            "dropped_votes",
        ):  # per head, on the device: no sum, no sync per step
            layer.scalars[name] = torch.zeros((b, h, 1), device=device)
        logits = window_logits(query, layer.keys, window, scaling, layer.spec.softcap)  # [b, h, g, w, L]
        # a decode step's constants as float32 0-d device tensors: an op with a Python number wraps it
        # into a tensor each time (microseconds per op on a CPU); the step's operands are float32, which
        # the number is rounded to either way
        for name, value in (
            ("log_group", math.log(logits.shape[2])),
            ("merge_threshold", self.threshold),
            ("zip_guard", self.guard),
            ("zip_max_factor", self.max_factor),
        ):
            layer.scalars[name] = torch.tensor(value, dtype=torch.float32, device=device)
        layer.scalars["pair_victim"] = torch.tensor([False, True], device=device)  # a pair's second member
        log_s = torch.logsumexp(logits, dim=2) - math.log(logits.shape[2])  # group mean of exp(logit)
        self.scores.init(layer, log_s)
        keep = self.prefill_keep(layer, query, scaling)
        if keep is not None:
            self.merge_evicted(layer, complement(keep, length))

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Update score estimates with this step's logits ``[b, h, group, slots]``; evict/merge one."""
        self.scores.update(layer, small_logsumexp(probs, dim=2) - layer.scalars["log_group"])
        victim = self.decode_victim(layer, None)
        if victim is not None:
            self.merge_evicted(layer, victim.unsqueeze(-1))

    # ------------------------------------------------------------------ merging
    def merge_evicted(
        self, layer: CompressedLayer, evicted: torch.Tensor, in_place: bool | None = None
    ) -> None:
        """Algorithm 1 for the slots ``evicted`` ``[batch, kv_heads, k]``: each merges into the
        retained slot of highest key cosine if above ``threshold`` (ZIP-Merging, Eq. 7), else is
        dropped; then the evicted slots are freed. Several tokens choosing one partner form one
        group (prefill). ``in_place`` (default: one evicted slot, a decode step): the merge touches
        only the pair (partner, victim) and the victim is dropped in place; otherwise every slot is
        a group (retained tokens alone are unchanged) and the layer keeps the retained slots.

        Raises
        ------
        ValueError
            For ``in_place`` with more than one evicted slot per head.
        """
        n, k = layer.store.n_slots, evicted.shape[-1]
        b, h = evicted.shape[:2]
        in_place = k == 1 if in_place is None else in_place
        if in_place and k != 1:
            raise ValueError(f"an in-place merge evicts one slot per head, got {k}")
        retained = None if in_place else complement(evicted, n)
        keys, values = layer.keys, layer.values  # read once (keys held as codes: decoded once)
        best, partner = cosine_partners(layer, evicted, retained, keys)
        merge = best > layer.scalars["merge_threshold"]  # float32 cosines
        log_weight = layer.store.log_weight
        not_merged = ~merge
        if in_place:  # members: the partner, then the victim (its votes dropped unless merged); one group
            members = torch.cat([partner, evicted], dim=-1)
            target, groups = members, 1  # one group: merge_groups reads no target
            pair_votes = log_weight.gather(2, members)
            evicted_votes = pair_votes[..., 1:]
            log_votes = pair_votes.masked_fill(not_merged & layer.scalars["pair_victim"], NEG_INF)
        else:  # members: every slot; group of a retained slot = itself, of an evicted one = its partner
            members = torch.arange(n, device=evicted.device).expand(b, h, n)
            target = members.scatter(2, evicted, partner)
            groups = n
            dropped = torch.zeros((b, h, n), dtype=torch.bool, device=evicted.device).scatter(
                2, evicted, not_merged
            )
            log_votes = log_weight.masked_fill(dropped, NEG_INF)
            evicted_votes = log_weight.gather(2, evicted)
        index = slot_index(keys, members)  # keys' and values' gather index, one when they match
        out = merge_groups(
            keys.gather(2, index),
            values.gather(2, index if values.shape == keys.shape else slot_index(values, members)),
            log_votes,
            self.scores.merge_score(layer, members),
            target,
            groups,
            zip_keys=self.merge == "zip",
            guard=layer.scalars["zip_guard"] if in_place else self.guard,  # float32 0-d: float32 only
            max_factor=layer.scalars["zip_max_factor"] if in_place else self.max_factor,
            merged=merge if in_place else None,
            dtype=torch.float32 if in_place else torch.float64,  # a pair: float32 suffices
        )
        slots = partner if in_place else members
        state = self.scores.merged(layer, out.log_score, MergeGroups(members, log_votes, target, groups))
        for name, count in (
            ("merges", merge),
            ("evictions", not_merged),
            ("zip_fallbacks", out.fallback),
            ("dropped_votes", evicted_votes.exp() * not_merged),
        ):
            layer.scalars[name] += count if in_place else count.sum(dim=-1, keepdim=True)
        layer.store.replace(
            slots, keys=out.keys, values=out.values, log_weight=out.log_votes, **{self.scores.state: state}
        )
        if in_place:
            layer.store.drop(evicted[..., 0])
        else:
            layer.store.keep(retained)
