"""Per-layer budgets from a user's list: layer ``l`` keeps ``L x budget x r_l / sum(r)`` slots per KV
head, so the run's total budget is kept and the list gives its shape across layers (kvpress's
``PerLayerCompressionPress`` takes one compression ratio per layer instead; ours stays a sweepable
budget). Any scorer ranks the tokens within a layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from methods.seam.layer import CompressedLayer
from methods.wrap import LayerBudgets, spread_evenly


@dataclass
class LayerRatios(LayerBudgets):
    """A per-layer ratio list over a scorer.

    Parameters
    ----------
    scorer : ScoreEvict
        Ranks the tokens within a layer.
    ratios : list[float]
        One positive weight per decoder layer (checked against the model before it loads).

    Raises
    ------
    ValueError
        For an empty list, a weight <= 0, or (``check_model``) a length other than the model's
        number of layers.
    """

    name: ClassVar[str] = "layer_ratios"

    ratios: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ratios = [float(r) for r in self.ratios]
        if not self.ratios or min(self.ratios) <= 0:
            raise ValueError(f"ratios must be a non-empty list of weights > 0, got {self.ratios}")

    def check_model(self, config) -> None:
        """The list has one weight per decoder layer."""
        super().check_model(config)
        layers = config.num_hidden_layers
        if len(self.ratios) != layers:
            raise ValueError(f"ratios has {len(self.ratios)} entries; the model has {layers} layers")

    def layer_budget(self, layer: CompressedLayer, budget: int) -> int:
        """``L x budget x r_l / sum(r)``, rounded so the layers add up to ``L x budget`` (at least
        one slot)."""
        total = sum(self.ratios)
        shares = spread_evenly([len(self.ratios) * budget * r / total for r in self.ratios])
        return max(1, shares[layer.spec.layer_idx])
