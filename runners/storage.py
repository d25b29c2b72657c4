"""The run's storage kind (``quant=``, docs/quantization.md): checked before any work and set for the
process (``methods.seam.cache.DEFAULT_STORAGE``), so every cache the run makes holds its keys and
values that way, whatever the method."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from methods import CompressionMethod
from methods.quant import QUANT_REGISTRY, check_method, storage_kind
from methods.seam.cache import DEFAULT_STORAGE
from methods.seam.storage import StorageKind
from methods.seam.store import SlotStore
from reports.store import quant_of
from tasks.errors import KVBenchError


def storage_of(cfg: DictConfig, method: CompressionMethod) -> StorageKind:
    """The storage kind ``quant=`` asks for, checked against the method.

    Raises
    ------
    KVBenchError
        For an unknown name, parameters its kind refuses, a method with ragged heads over a kind without them
        (``methods.quant.check_method``), or quantized storage with ``backend=compiled`` (not proven:
        KIVI's residual bookkeeping is host-side).
    """
    name = quant_of(cfg)
    if name != "none" and cfg.get("backend", "eager") != "eager":
        raise KVBenchError(
            f"quant={name} runs eager decode steps; backend={cfg.backend} is not supported with it"
        )
    node = cfg.get("quant")
    params = {} if node is None else {k: v for k, v in OmegaConf.to_container(node).items() if k != "name"}
    if name not in QUANT_REGISTRY:
        raise KVBenchError(f"unknown quant {name!r} (known: {sorted(QUANT_REGISTRY)})")
    try:
        kind = storage_kind(name, params)
        check_method(method, name)
    except (ValueError, TypeError) as err:
        raise KVBenchError(f"quant={name}: {err}") from err
    return kind or SlotStore


def set_storage(cfg: DictConfig, method: CompressionMethod) -> None:
    """Make :func:`storage_of` the storage kind of every cache of this process (raises as it does)."""
    DEFAULT_STORAGE[0] = storage_of(cfg, method)
