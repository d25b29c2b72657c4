"""The run's storage kind (``quant=``, docs/quantization.md): worked out once per run (per setting of
a grid), before any model loads, and passed to every cache the run makes
(``CompressedCache(storage=...)``), so its caches hold keys and values that way, whatever the method."""

from __future__ import annotations

from methods import CompressionMethod
from methods.quant import QUANT_REGISTRY, storage_kind
from methods.seam.storage import MergingStorage, StorageKind
from runners.setup.settings import RunSettings
from tasks.errors import KVBenchError


def storage_of(settings: RunSettings, method: CompressionMethod) -> StorageKind:
    """The storage kind ``quant=`` asks for (``RunSettings.quant``), checked against the method.

    Raises
    ------
    KVBenchError
        For an unknown name, parameters its kind refuses, a merging method (``Traits.merges``) over a
        kind whose store does not merge, a kind the method refuses (``check_storage``), or quantized
        storage with ``backend=compiled`` (not proven: KIVI's residual bookkeeping is host-side).
    """
    name, params = settings.quant.name, dict(settings.quant_params)
    if name != "none" and settings.backend != "eager":
        raise KVBenchError(
            f"quant={name} runs eager decode steps; backend={settings.backend} is not supported with it"
        )
    if name not in QUANT_REGISTRY:
        raise KVBenchError(f"unknown quant {name!r} (known: {sorted(QUANT_REGISTRY)})")
    try:
        kind = storage_kind(name, params)
    except (ValueError, TypeError) as err:
        raise KVBenchError(f"quant={name}: {err}") from err
    store = kind({}, lambda needed: needed)
    if method.traits.merges and not isinstance(store, MergingStorage):
        raise KVBenchError(f"{method.label} merges slots, which quant={name} storage does not offer")
    try:
        method.check_storage(store)
    except ValueError as err:
        raise KVBenchError(f"{method.label} with quant={name}: {err}") from err
    return kind
