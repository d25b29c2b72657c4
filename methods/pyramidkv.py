"""PyramidKV (Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
Information Funneling"): layer budgets that decrease linearly with depth, SnapKV's scores within
each layer.

Sec. 3.3: lower layers attend broadly and get more slots, upper layers fewer; the budgets form an
arithmetic sequence whose mean is the run's budget. As the official code (KVCache-Factory
``PyramidKVCluster``) computes it: besides the protected tokens (SnapKV's observation window) a layer
selects ``max - l (max - min) / (L - 1)`` tokens, with ``min = r / beta``, ``max = 2 r - min`` for the
``r = budget - window`` tokens a uniform layer selects (``max`` capped at the prompt, ``min`` raised to
keep the mean). kvpress's ``PyramidKVPress`` (0.5.5) shares the whole budget instead, window included
(``r = budget``): at an equal budget its top layer keeps ``B / beta`` tokens, this one
``w + (B - w) / beta``. The rounding is spread so the layers' budgets add up to exactly ``L x budget``.
``window_in_budget=true`` (preset ``pyramidkv_kvpress``) is kvpress's: :func:`kvpress_budgets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from methods.seam.layer import CompressedLayer
from methods.seam.plan import budget_share
from methods.wrap import LayerBudgets, spread_evenly


def pyramid_budgets(budget: int, protected: int, prompt: int, layers: int, beta: float) -> list[int]:
    """Per-layer slot budgets of PyramidKV (module docstring).

    Parameters
    ----------
    budget : int
        The run's slots per (layer, KV head).
    protected : int
        Tokens every layer keeps besides its selection (the observation window and sinks).
    prompt : int
        Prompt length (tokens).
    layers : int
        Decoder layers ``L``.
    beta : float
        Pyramid steepness (>= 1): the top layer selects ``1 / beta`` of a uniform layer's share.

    Returns
    -------
    list[int]
        ``L`` budgets, non-increasing with depth, summing to ``L x budget`` (all ``budget`` when
        the prompt fits, a single layer, or no token is left to select).
    """
    r = budget - protected
    if layers == 1 or r <= 0 or budget >= prompt:
        return [budget] * layers
    low = r / beta
    high = 2 * r - low
    if high > prompt - protected:
        high = prompt - protected
        low = 2 * r - high
    step = (high - low) / (layers - 1)
    return [protected + n for n in spread_evenly([high - i * step for i in range(layers)])]


def kvpress_budgets(share_tokens: float, window: int, prompt: int, layers: int, beta: float) -> list[int]:
    """kvpress 0.5.5's ``PyramidKVPress.get_layer_budget`` for every layer: the whole budget shared,
    window included. ``cap = w + s`` for the ``s = prompt x (1 - ratio)`` tokens (a float) a uniform
    layer keeps; ``min = s / beta``, ``max = 2 s - min`` (``max`` capped at ``prompt - w``, ``min``
    raised to keep the mean); layer ``l`` keeps ``round(max - l (max - min) / (L - 1))`` tokens, its
    window among them. Unless ``prompt >= max >= min >= w``: every layer ``max(1, round(s))`` (SnapKV).

    Returns
    -------
    list[int]
        ``L`` budgets (slots per KV head, the window included).
    """
    low = share_tokens / beta
    high = share_tokens * 2 - low
    if high >= prompt - window:
        high = prompt - window
        low = share_tokens * 2 - high
    if not prompt >= high >= low >= window:
        return [max(1, round(share_tokens))] * layers
    step = (high - low) / (layers - 1) if layers > 1 else 0.0
    return [round(high - i * step) for i in range(layers)]


@dataclass
class PyramidKV(LayerBudgets):
    """PyramidKV's linear layer budgets over a scorer (SnapKV in the paper and the preset).

    Parameters
    ----------
    scorer : ScoreEvict
        Ranks the tokens within a layer.
    beta : float
        Pyramid steepness (paper and kvpress: 20).
    window_in_budget : bool
        kvpress's schedule (:func:`kvpress_budgets`): the window shares the budget; False: the
        official code's (:func:`pyramid_budgets`).

    Raises
    ------
    ValueError
        For ``beta`` < 1 or a scorer that ranks no tokens.
    """

    name: ClassVar[str] = "pyramidkv"
    PAPER_SCORER: ClassVar[str] = "snapkv"  # the paper's method: named ``pyramidkv``

    beta: float = 20.0
    window_in_budget: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta < 1:
            raise ValueError(f"beta must be >= 1, got {self.beta}")

    def layer_budget(self, layer: CompressedLayer, budget: int) -> int:
        """This layer's entry of :func:`pyramid_budgets` or :func:`kvpress_budgets` (protected: the
        scorer's under ``budget``)."""
        protected, prompt = sum(self.scorer.protected(budget)), layer.store.n_slots
        layers = layer.spec.num_layers
        if self.window_in_budget:
            share = budget_share(layer.share, budget, prompt) * prompt
            return kvpress_budgets(share, protected, prompt, layers, self.beta)[layer.spec.layer_idx]
        return pyramid_budgets(budget, protected, prompt, layers, self.beta)[layer.spec.layer_idx]
