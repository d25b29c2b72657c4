"""KeepKV's attention-score estimators (Tian et al., Sec. 3.4; docs/methods.md, "KeepKV"), as small
objects: how ``s_hat`` is initialised at prefill, updated at each decode step, ranked, read for
ZIP-merging, and carried through a merge. All in the log domain (float32, no overflow).

- :class:`EMAEstimator`: Eq. 8, the bias-corrected EMA ``s_hat = S / (1 - alpha^n)`` of the
  unnormalised scores ``s = exp(logit)``, kept as ``ln S`` in ``layer.store.state["log_ema"]``
  ``[batch, kv_heads, slots]``.
- :class:`WindowMeanEstimator`: the official code's mean of ``exp(logit)`` over the last ``w``
  queries, kept as the rows ``layer.store.state["rows"]`` ``[batch, kv_heads, slots, w]`` (oldest first),
  ranked with weights 1.0 -> ``distance_weight`` (newest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from methods.keepkv.zip_merge import MergeGroups, group_logsumexp
from methods.seam.layer import CompressedLayer
from methods.seam.uniform import gather_slots

NEG_INF = float("-inf")


@dataclass
class EMAEstimator:
    """Eq. 8 with decay ``alpha`` (None: ``1 - 2 / (w + 1)``, the span of the code's window mean)."""

    alpha: float | None = None
    state: str = "log_ema"

    def decay(self, window: int) -> float:
        """``alpha`` for a window of ``window`` prompt queries."""
        return self.alpha if self.alpha is not None else 1.0 - 2.0 / (window + 1)

    def init(self, layer: CompressedLayer, log_s: torch.Tensor) -> None:
        """``ln S`` from the last ``w`` prompt queries' ``ln s`` ``[batch, kv_heads, w, prompt]``."""
        window = log_s.shape[-2]
        alpha = self.decay(window)
        age = torch.arange(window - 1, -1, -1, device=log_s.device, dtype=torch.float32)
        log_coef = math.log(1 - alpha) + torch.where(
            age > 0, age * (math.log(alpha) if alpha > 0 else NEG_INF), torch.zeros_like(age)
        )
        layer.store.write(self.state, torch.logsumexp(log_s + log_coef[:, None], dim=-2))

        # per-sample constants as 0-d device tensors: a decode step does no Python float arithmetic on
        # them, so a compiled step is reused across samples and steps; float64 for the bias
        # correction, float32 for the terms of the float32 update (rounded to float32 either way)
        def const(x: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
            return torch.tensor(x, dtype=dtype, device=log_s.device)

        layer.scalars["ema_alpha"] = const(alpha)
        layer.scalars["ema_log_alpha"] = const(math.log(alpha) if alpha > 0 else NEG_INF, torch.float32)
        layer.scalars["ema_log_1m_alpha"] = const(math.log(1 - alpha), torch.float32)
        layer.scalars["ema_terms"] = const(float(window))
        layer.scalars["ema_one"] = const(1.0)  # the step's increment of ``ema_terms``
        layer.scalars["ema_correction"] = const(0.0)
        layer.scalars["ema_correction_f32"] = const(0.0, torch.float32)  # what float32 operands read
        self._correct(layer)

    def update(self, layer: CompressedLayer, log_s: torch.Tensor) -> None:
        """``S <- alpha S + (1 - alpha) s`` with this step's ``ln s`` ``[batch, kv_heads, slots]``."""
        old = layer.store.view(self.state) + layer.scalars["ema_log_alpha"]
        layer.store.write(self.state, torch.logaddexp(old, layer.scalars["ema_log_1m_alpha"] + log_s))
        layer.scalars["ema_terms"] += layer.scalars["ema_one"]
        self._correct(layer)

    @staticmethod
    def _correct(layer: CompressedLayer) -> None:
        """Store ``-ln(1 - alpha^n)`` for the current ``n`` (once per step, read by every merge), in
        place (a compiled step's inputs keep their storage), and its float32 rounding (a float64 0-d
        operand of float32 tensors is rounded to float32 first: the same sums, without the cast per op)."""
        scalars = layer.scalars
        correction = torch.neg(
            torch.log1p(torch.pow(scalars["ema_alpha"], scalars["ema_terms"]).neg_()),
            out=scalars["ema_correction"],
        )
        scalars["ema_correction_f32"].copy_(correction)

    def correction(self, layer: CompressedLayer, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """``-ln(1 - alpha^n)``: Eq. 8's bias correction in the log domain (``n`` EMA terms; 0 for
        ``alpha = 0``), a 0-d tensor: float64, or for ``dtype`` float32 its float32 rounding."""
        return layer.scalars["ema_correction_f32" if dtype == torch.float32 else "ema_correction"]

    def select(self, layer: CompressedLayer) -> torch.Tensor:
        """``ln(p * s_hat)`` up to a per-layer constant (ranking only): ``[batch, kv_heads, slots]``."""
        return layer.store.log_weight + layer.store.view(self.state)

    def merge_score(self, layer: CompressedLayer, slots: torch.Tensor | None = None) -> torch.Tensor:
        """``ln s_hat`` (ZIP-merging's scores) of every slot ``[batch, kv_heads, slots]``, or of the
        slots ``slots`` ``[batch, kv_heads, k]`` only."""
        state = layer.store.view(self.state)  # float32
        return (state if slots is None else state.gather(2, slots)) + self.correction(layer, state.dtype)

    def merged(self, layer: CompressedLayer, log_score: torch.Tensor, plan: MergeGroups) -> torch.Tensor:
        """The state of merged slots ``[batch, kv_heads, groups]`` from the merge's ``ln s_hat``
        ``log_score`` (the groups ``plan`` are not needed)."""
        state = log_score - self.correction(layer, log_score.dtype)
        return state if state.dtype == torch.float32 else state.float()


@dataclass
class WindowMeanEstimator:
    """The official code's window mean; ``distance_weight`` weights the newest row for ranking."""

    distance_weight: float = 1.2
    state: str = "rows"

    def init(self, layer: CompressedLayer, log_s: torch.Tensor) -> None:
        """The rows ``[batch, kv_heads, prompt, w]`` from ``ln s`` ``[batch, kv_heads, w, prompt]``."""
        layer.store.write(self.state, log_s.transpose(-1, -2))

    def update(self, layer: CompressedLayer, log_s: torch.Tensor) -> None:
        """Drop the oldest row, append this step's ``ln s`` ``[batch, kv_heads, slots]``."""
        rows = layer.store.state[self.state]
        layer.store.write(self.state, torch.cat([rows[..., 1:], log_s.unsqueeze(-1)], dim=-1))

    def select(self, layer: CompressedLayer) -> torch.Tensor:
        """``ln(p * weighted window sum)``: ``[batch, kv_heads, slots]``."""
        rows = layer.store.state[self.state]
        weights = torch.linspace(1.0, self.distance_weight, rows.shape[-1], device=rows.device)
        return layer.store.log_weight + torch.logsumexp(rows + weights.log(), dim=-1)

    def merge_score(self, layer: CompressedLayer, slots: torch.Tensor | None = None) -> torch.Tensor:
        """``ln`` of the mean over the finite rows: ``[batch, kv_heads, slots]``, or of the slots
        ``slots`` ``[batch, kv_heads, k]`` only."""
        rows = layer.store.state[self.state]
        rows = rows if slots is None else gather_slots(rows, slots)
        count = torch.isfinite(rows).sum(dim=-1).clamp(min=1)
        return torch.logsumexp(rows, dim=-1) - count.log()

    def merged(self, layer: CompressedLayer, log_score: torch.Tensor, plan: MergeGroups) -> torch.Tensor:
        """Vote-weighted average of the members' rows within each merge group of ``plan`` (official
        code), in the log domain: ``[batch, kv_heads, groups, w]`` (``log_score`` is not needed)."""
        rows = gather_slots(layer.store.state[self.state], plan.members)
        weighted = plan.log_votes.unsqueeze(-1) + rows  # dropped members have ln p = -inf
        log_p = group_logsumexp(plan.log_votes, plan.target, plan.groups)
        return (group_logsumexp(weighted, plan.target, plan.groups) - log_p.unsqueeze(-1)).float()
