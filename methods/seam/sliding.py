"""The rule every method follows on a sliding-window layer (Mistral-v0.1, Gemma-2/3, Phi-3, ...).

A sliding layer attends only to the last ``window`` tokens (itself included), so the model's own
cache keeps the last ``window - 1`` and never more. On such a layer, whatever the method, the
seam keeps the most recent ``min(budget, window - 1)`` tokens (``window - 1`` for FullKV): at
prefill the window's tail of the prompt, then one eviction of the oldest token per decode step.
This is exactly the model's own cache when ``budget >= window - 1``, and the tightest recent
window inside the sliding window when the budget is smaller; the method's own scoring, merging
and state apply to the full-attention layers, where tokens outside any window are kept. The rule
is recorded in every run's protocol (``sliding_layers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from methods.seam.architecture import LayerSpec
from methods.seam.contract import CompressionMethod, Traits

if TYPE_CHECKING:
    from methods.seam.layer import CompressedLayer

SLIDING_RULE = "recent min(budget, window - 1) tokens (window - 1 for fullkv); method applies to full layers"


def layer_protocol(specs: list[LayerSpec]) -> dict:
    """What a run records of the model's layers: counts, the sliding window and its rule, the
    logit soft-cap (keys only where the model has them)."""
    sliding = [s.window for s in specs if s.window is not None]
    out: dict = {"layers": len(specs)}
    if sliding:
        out |= {"sliding_layers": len(sliding), "sliding_window": max(sliding), "sliding_rule": SLIDING_RULE}
    if specs and specs[0].softcap is not None:
        out["attn_logit_softcapping"] = specs[0].softcap
    return out


def sliding_bound(budget: int | None, window: int) -> int:
    """Slots a sliding layer of ``window`` tokens holds between decode steps under ``budget``."""
    return window - 1 if budget is None else max(1, min(budget, window - 1))


@dataclass
class SlidingWindow(CompressionMethod):
    """Keep the most recent ``layer.budget`` tokens of a sliding-window layer (all heads alike)."""

    name: ClassVar[str] = "sliding_window"
    TRAITS: ClassVar[Traits] = Traits(decode_input="none", uses_log_weight=False)

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Keep the prompt's last ``plan.keep`` tokens (the prompt is held in position order)."""
        n, keep = layer.store.n_slots, layer.plan.keep
        if keep is not None and n > keep:
            b, h = layer.keys.shape[:2]
            layer.store.keep(torch.arange(n - keep, n, device=layer.keys.device).expand(b, h, keep))

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Once over the bound, evict the oldest token."""
        if layer.store.n_slots > layer.plan.bound:
            layer.store.drop(layer.store.positions.argmin(dim=-1))
