"""The cache seam: everything a method stands on, and nothing method-specific.

- ``contract``: :class:`CompressionMethod`, the rules every method states;
  ``evict``: :class:`ScoreEvict`, the score-then-evict base most methods subclass.
- ``cache``, ``layer``, ``store``: the ``transformers.Cache`` of compressed layers, one
  :class:`CompressedLayer` per decoder layer over a fixed-capacity :class:`SlotStore`.
- ``attention`` (the ``"kvbench"`` attention registered with transformers), ``step`` (the step
  order: append, attend, update scores, evict/merge), ``architecture`` (what a model's config says
  of each layer), ``rope`` (a layer's rotary embedding), ``sliding`` (the sliding-window rule).
- ``budget`` (a run's budget in slots per sample), ``scoring`` (shared rankings and selections).

docs/extending.md lists the names a method author uses.
"""

from methods.seam.contract import CompressionMethod
from methods.seam.evict import ScoreEvict
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.store import SlotStore

__all__ = ["CompressedLayer", "CompressionMethod", "LayerPlan", "ScoreEvict", "SlotStore"]
