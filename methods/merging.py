"""Merging: merge-on-evict over any scorer (kvpress 0.5.5 ``MergingPress``, ``merging_press.py``;
after Token Merging, Bolya et al. ICLR 2023, and D2O, Wan et al. 2024, arXiv 2406.13035).

A wrapper (``methods.wrap``): the scorer chooses the kept prompt tokens as it does alone; before the
evicted ones are freed, each evicted token's value is folded into the kept token whose key is the
most cosine-similar (:func:`merge_evicted`). Keys are kept as they are (RoPE-safe). Once, at
prefill (kvpress); decoding appends.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.checks import check_range
from methods.evict import ScoreEvict
from methods.knorm import KNorm
from methods.scoring import complement
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.slots import gather_slots
from methods.wrap import ScorerWrapper

EPS = 1e-6  # kvpress's ``_EPS``: norms and the weight's denominator


def merge_evicted(
    keys: torch.Tensor,
    values: torch.Tensor,
    kept: torch.Tensor,
    similarity_threshold: float = 0.0,
    merge_fraction: float = 1.0,
) -> torch.Tensor:
    """The kept slots' values after the evicted ones are folded in (kvpress ``MergingPress.merge``).

    Per head, evicted token ``e`` picks the kept token ``t`` with the highest key cosine ``s_e``; it
    merges when ``s_e >= similarity_threshold`` and, for ``merge_fraction < 1``, ``s_e`` is at least
    the ``1 - merge_fraction`` quantile (linear) of the head's merging ``s`` (others at ``-inf``). Its
    weight is ``w_e = max(s_e, 0) ||v_e|| / (||v_e|| + ||v_t|| + 1e-6)`` (``v_t`` before any merge);
    a target that receives any weight becomes ``(v_t + sum_e w_e v_e) / (1 + sum_e w_e)`` (float32).

    Parameters
    ----------
    keys, values : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]`` (keys post-RoPE, as cached).
    kept : torch.Tensor
        ``[batch, kv_heads, k]`` int64: the kept slots (distinct per head).
    similarity_threshold : float
        Least cosine for a merge, in [0, 1].
    merge_fraction : float
        Share of the merging evicted tokens (by cosine) that merge, in (0, 1].

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, k, head_dim]``: the values at ``kept``, merged, in ``values``' dtype.
    """
    n, k = keys.shape[2], kept.shape[2]
    kept_values = gather_slots(values, kept)
    if k == n or k == 0:
        return kept_values
    evicted = complement(kept, n)
    unit_kept = F.normalize(gather_slots(keys, kept).float(), dim=-1, eps=EPS)
    unit_evicted = F.normalize(gather_slots(keys, evicted).float(), dim=-1, eps=EPS)
    sim, target = (unit_evicted @ unit_kept.transpose(-2, -1)).max(dim=-1)  # [batch, kv_heads, n - k]
    merges = sim >= similarity_threshold
    if merge_fraction < 1.0 and bool(merges.any()):
        floor = sim.masked_fill(~merges, -torch.inf).quantile(1.0 - merge_fraction, dim=-1, keepdim=True)
        merges &= sim >= floor
    v_e = gather_slots(values, evicted).float()
    norm_e, norm_t = v_e.norm(dim=-1), kept_values.float().norm(dim=-1).gather(2, target)
    weight = sim.clamp(min=0) * merges * norm_e / (norm_e + norm_t + EPS)
    total = torch.zeros(kept.shape, dtype=torch.float32, device=keys.device).scatter_add_(2, target, weight)
    summed = torch.zeros(kept_values.shape, dtype=torch.float32, device=keys.device)
    summed.scatter_add_(2, target[..., None].expand_as(v_e), weight[..., None] * v_e)
    merged = ((kept_values.float() + summed) / (1.0 + total)[..., None]).to(values.dtype)
    return torch.where((total > 0)[..., None], merged, kept_values)


@dataclass
class Merging(ScorerWrapper):
    """Merge-on-evict over a scorer (module docstring; kvpress's ``MergingPress``).

    Parameters
    ----------
    scorer : ScoreEvict
        Chooses the kept tokens (kvpress has no default inner press; KNorm, as in kvpress's tests).
    similarity_threshold : float
        Least key cosine for a merge, in [0, 1] (kvpress: 0.0).
    merge_fraction : float
        Share of the evicted tokens, by cosine, that merge, in (0, 1] (kvpress: 1.0).

    Raises
    ------
    ValueError
        For options outside their ranges or a scorer that ranks no tokens.
    """

    name: ClassVar[str] = "merging"
    #: once, at prefill (kvpress); decoding appends
    OVERRIDES: ClassVar[dict] = {"prompt_only": True, "decode_rule": False, "decode_input": "none"}
    PAPER_SCORER: ClassVar[str] = "knorm"  # the preset's (kvpress has no default): named ``merging``

    scorer: ScoreEvict = field(default_factory=KNorm)
    similarity_threshold: float = 0.0
    merge_fraction: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range(self, "similarity_threshold")
        if not 0.0 < self.merge_fraction <= 1.0:
            raise ValueError(f"merge_fraction must be in (0, 1], got {self.merge_fraction}")

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The scorer's plan with no decode bound."""
        return replace(self.scorer.plan(layer), bound=None)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """The scorer's kept slots (``prefill_keep``), their values merged (:func:`merge_evicted`); the
        evicted slots freed."""
        kept = self.scorer.prefill_keep(layer, query, scaling)
        if kept is None:
            return
        merged = merge_evicted(layer.keys, layer.values, kept, self.similarity_threshold, self.merge_fraction)
        layer.store.keep(kept)
        layer.store.write("values", merged)

    decode_attention = CompressionMethod.decode_attention
