"""The storage kinds of ``quant=`` by name (:data:`QUANT_REGISTRY`): each module of ``methods.quant``
registers its own (``methods.quant`` imports them all), so a new kind is one file and its config."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore


def plain(**params: object) -> StorageKind:
    """``quant=none``: the uniform store of keys and values as they are.

    Raises
    ------
    ValueError
        For any parameter.
    """
    if params:
        raise ValueError(f"quant=none takes no parameters, got {sorted(params)}")
    return SlotStore


#: ``quant=`` name (``configs/quant/<name>.yaml``) -> what makes its storage kind from the config's
#: parameters (``bits``, ``group``, ``residual``).
QUANT_REGISTRY: dict[str, Callable[..., StorageKind]] = {"none": plain}


def register_codec(*names: str) -> Callable[[type], type]:
    """Register a codec class (``methods.seam.storage.Codec``, a dataclass of the config's parameters)
    under ``names``: its kind is the uniform store holding it, handed on to ragged heads."""

    def add(cls: type) -> type:
        for name in names:
            QUANT_REGISTRY[name] = lambda **params: partial(SlotStore, codec=cls(**params))
        return cls

    return add


def register_store(*names: str) -> Callable[[type], type]:
    """Register a store class of a stateful codec (KIVI: ``(fills, capacity, **params)``) under
    ``names``."""

    def add(cls: type) -> type:
        for name in names:
            QUANT_REGISTRY[name] = partial(partial, cls)
        return cls

    return add
