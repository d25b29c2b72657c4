"""Quantized KV storage (``quant=``): codecs that hold keys and values as integer codes, for any
method and either layout (docs/quantization.md).

Every module here registers its kinds in ``QUANT_REGISTRY`` (``methods.quant.registry``) when this
package imports it; :func:`storage_kind` makes the kind of a ``quant=`` name from the config's
parameters.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from methods.quant.registry import QUANT_REGISTRY
from methods.seam.storage import StorageKind

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def storage_kind(name: str, params: Mapping[str, int]) -> StorageKind:
    """The storage kind of ``quant=<name>`` with the config's ``params`` (``bits``, ``group``,
    ``residual``), checked by making one empty store.

    Raises
    ------
    KeyError
        For a name :data:`QUANT_REGISTRY` does not list.
    ValueError
        For parameters the kind refuses (bit width, R not a multiple of G), or any for ``none``.
    TypeError
        For a parameter the kind does not take.
    """
    kind = QUANT_REGISTRY[name](**params)
    kind({}, lambda needed: needed)
    return kind


__all__ = ["QUANT_REGISTRY", "storage_kind"]
