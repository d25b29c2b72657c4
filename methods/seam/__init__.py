"""The cache seam: what every method shares, and nothing method-specific.

- ``contract``: :class:`CompressionMethod`; ``traits``: the :class:`Traits` a method declares once.
- ``cache``, ``layer``: the ``transformers.Cache`` of compressed layers, one :class:`CompressedLayer`
  per decoder layer over a store, a layout holding a codec: ``storage`` (the interfaces
  :class:`SlotStorage`, :class:`MergingStorage` and the codec's), ``store`` (uniform heads,
  :class:`SlotStore`) and ``ragged`` (heads of their own lengths).
- ``attention`` (the ``"kvbench"`` attention registered with transformers), ``step`` (the step order:
  append, attend, update scores, evict/merge), ``sliding`` (the sliding-window rule), ``architecture``
  and ``rope`` (what a model's config says of each layer), ``plan`` (a layer's budget arithmetic).

The method bases (``methods.evict``, ``methods.wrap``) and shared scoring (``methods.scoring``) live
beside the methods; several caches' decode steps in one forward (``runners.generation.rows``) and a run's
budget in slots (``runners.setup.budget``) with the runners. docs/extending.md lists the names a
method author uses.
"""

from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.storage import SlotStorage
from methods.seam.traits import Traits
from methods.seam.uniform import SlotStore

__all__ = ["CompressedLayer", "CompressionMethod", "LayerPlan", "SlotStorage", "SlotStore", "Traits"]
