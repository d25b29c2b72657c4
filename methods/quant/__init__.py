"""Quantized KV storage (``quant=``): storage kinds (``methods.seam.storage.StorageKind``) that hold
keys and values as integer codes, for any method (docs/quantization.md).

``QUANT_REGISTRY`` maps the ``quant=`` name (``configs/quant/<name>.yaml``) to its store class (None:
the uniform full-precision store); :func:`storage_kind` makes the kind from the config's parameters.
Head-adaptive allocators (ragged heads) are refused over a kind that does not hold ragged heads
(``ragged_heads``; every registered kind holds them: :func:`check_method`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from methods.quant.kivi import KiviStore
from methods.quant.per_token import PerTokenStore
from methods.seam.contract import CompressionMethod
from methods.seam.storage import StorageKind

QUANT_REGISTRY: dict[str, type | None] = {
    "none": None,
    "int8": PerTokenStore,
    "int4": PerTokenStore,
    "kivi2": KiviStore,
    "kivi4": KiviStore,
}
#: Registry names of the methods that give heads their own slot counts (ragged heads: AdaKV,
#: DuoAttention, SimLayerKV, KVzip, DMS), which a quantized kind holds when it has ``ragged_heads``.
RAGGED_METHODS = frozenset({"adakv", "duo_attention", "simlayerkv", "kvzip", "dms"})


def ragged_parts(method: CompressionMethod) -> list[str]:
    """Names of ``method`` and of the scorers it wraps (``scorer`` fields, recursively) that make
    ragged heads (:data:`RAGGED_METHODS`)."""
    found, part = [], method
    while part is not None:
        if part.name in RAGGED_METHODS:
            found.append(part.name)
        part = getattr(part, "scorer", None)
    return found


def storage_kind(name: str, params: Mapping[str, int]) -> StorageKind | None:
    """The storage kind of ``quant=<name>`` with the config's ``params`` (``bits``, ``group``,
    ``residual``), checked by making one empty store; None for ``none``.

    Raises
    ------
    KeyError
        For a name :data:`QUANT_REGISTRY` does not list.
    ValueError
        For parameters the kind refuses (bit width, R not a multiple of G), or any for ``none``.
    TypeError
        For a parameter the kind does not take.
    """
    cls = QUANT_REGISTRY[name]
    if cls is None:
        if params:
            raise ValueError(f"quant=none takes no parameters, got {sorted(params)}")
        return None
    kind = partial(cls, **params)
    kind({}, lambda needed: needed)
    return kind


def check_method(method: CompressionMethod, quant: str) -> None:
    """Refuse a method that makes ragged heads over a quantized kind that does not hold them.

    Raises
    ------
    ValueError
        If the kind of ``quant`` has no ``ragged_heads`` and the method (or a scorer it wraps) is
        head-adaptive.
    """
    ragged = ragged_parts(method)
    if ragged and not getattr(QUANT_REGISTRY.get(quant), "ragged_heads", True):
        held = ", ".join(n for n, cls in QUANT_REGISTRY.items() if getattr(cls, "ragged_heads", True))
        raise ValueError(
            f"{ragged[0]} gives heads their own slot counts (ragged heads), which quant={quant} storage "
            f"does not hold; use one of quant={held} with it"
        )


__all__ = ["QUANT_REGISTRY", "RAGGED_METHODS", "KiviStore", "PerTokenStore", "check_method", "storage_kind"]
