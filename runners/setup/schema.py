"""Every option of a run checked from one schema before anything loads: the dataclass that takes it.

A method or task config node is checked against the dataclass its ``_target_`` names (a nested
``_target_``, a wrapper's ``scorer``, against its own); the ``quant`` and ``runner`` nodes against the
option dataclasses of ``runners.setup.options``. A field's annotation gives the type (``int``, ``float``,
``bool``, ``str``, ``Literal``, ``X | None``, ``list[X]``, a nested method), its metadata the range
(:func:`methods.checks.option`: ``low``, ``high``, either of them a model fact such as
``"max_context"`` or ``"head_dim"``, checked once the model's config is read). A key no field takes
is refused, a string never passes as a boolean and a float must be finite. A new method's options
are so checked with no new code. Each failure is one :class:`tasks.errors.KVBenchError` naming the
field.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import types
import typing
from collections.abc import Mapping

from omegaconf import DictConfig, ListConfig, OmegaConf

from methods.checks import CLAMP, RANGE
from runners.results.store import quant_of
from runners.setup.options import RUNNER_OPTIONS, QuantOptions
from tasks.errors import KVBenchError

#: The facts of the model a range may name (:func:`model_facts`), in words for a message.
FACTS = {"max_context": "the model's context", "head_dim": "the model's head_dim"}


def target_class(target: object) -> type | None:
    """The class a ``_target_`` names, or None when it names none (the build then says so)."""
    module, _, name = str(target or "").rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _hints(cls: type) -> dict:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation only a type checker resolves: left unchecked
        return {}


def _words(kind: object) -> str:
    """What a value of annotation ``kind`` is, in words."""
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if kind in names:
        return names[kind]
    if typing.get_origin(kind) is typing.Literal:
        return f"one of {list(typing.get_args(kind))}"
    if typing.get_origin(kind) in (list, tuple):
        return "a list"
    return getattr(kind, "__name__", str(kind))


def _arms(kind: object) -> tuple:
    return typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)


def _fits(value: object, kind: object) -> bool:
    """Whether ``value`` (a config value: ``DictConfig`` and ``ListConfig`` as read) is of ``kind``."""
    origin = typing.get_origin(kind)
    if kind in (typing.Any, object) or isinstance(kind, typing.TypeVar):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if origin is typing.Literal:
        return any(value == x and type(value) is type(x) for x in typing.get_args(kind))
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind is str:
        return isinstance(value, str)
    if origin in (list, tuple) or kind in (list, tuple):
        inner = [a for a in typing.get_args(kind) if a is not Ellipsis]
        return isinstance(value, ListConfig | list | tuple) and all(
            _fits(x, inner[0]) for x in value if inner
        )
    if origin in (dict, Mapping) or kind in (dict, Mapping):
        return isinstance(value, DictConfig | dict)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):  # a nested method: a node with _target_
        return isinstance(value, DictConfig | dict) and "_target_" in value
    return not isinstance(value, str | int | float | bool)  # another class: no scalar stands for it


def _bound(edge: object, facts: Mapping) -> tuple[float | None, str]:
    """A range's edge and its text: a number, or a model fact (None until ``facts`` holds it)."""
    if isinstance(edge, str):
        value = facts.get(edge)
        return value, f"{value} ({FACTS.get(edge, edge)})"
    return edge, f"{edge:g}" if edge is not None else ""


def _inside(value: object, edges: tuple, facts: Mapping) -> bool:
    """Whether a number ``value`` lies in ``edges`` (``(low, high)``); anything else is not ranged."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return True
    (low, _), (high, _) = _bound(edges[0], facts), _bound(edges[1], facts)
    return (low is None or value >= low) and (high is None or value <= high)


def _wanted(kind: object, edges: tuple | None, facts: Mapping) -> str:
    """What a value of annotation ``kind`` with range ``edges`` must be, in words."""
    arms = _arms(kind)
    null = " or null" if type(None) in arms else ""
    if not edges:
        return " or ".join(_words(arm) if arm is not type(None) else "null" for arm in arms)
    words = _words(next(arm for arm in arms if arm is not type(None)))
    (low, low_text), (high, high_text) = _bound(edges[0], facts), _bound(edges[1], facts)
    if low is not None and high is not None:
        return f"{words} in [{low_text}, {high_text}]{null}"
    if high is not None:
        return f"{words} <= {high_text}{null}"
    if low is None:
        return f"{words}{null}"
    return (
        "a positive integer"
        if words == "an integer" and low == 1 and not null
        else f"{words} >= {low_text}{null}"
    )


def _value(node: DictConfig, key: str) -> object:
    value = node[key]
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, ListConfig) else value


def check_node(
    node: DictConfig | Mapping, cls: type, prefix: str, facts: Mapping | None = None, label: str = ""
) -> None:
    """Check each key of ``node`` against the field of dataclass ``cls`` that takes it (module
    docstring); ``prefix`` names the node in messages (``method``, ``method.scorer``), ``label`` what
    takes the options (default: the class's registry name). Ranges that name a model fact are checked
    when ``facts`` holds it.

    Raises
    ------
    KVBenchError
        For the first key no field takes, or value of the wrong type or out of range.
    """
    facts = facts or {}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    label = label or getattr(cls, "name", cls.__name__)
    for key in node:
        if str(key).startswith("_"):
            continue
        if key not in fields:
            known = ", ".join(fields)
            raise KVBenchError(f"{prefix}.{key} is not an option of {label} (its options: {known})")
        if OmegaConf.is_config(node) and OmegaConf.is_missing(node, key):
            continue  # a mandatory value left unset: ``runners.setup.build.build_node`` names it
        value, kind = _value(node, key), hints.get(key, typing.Any)
        if value is None and OmegaConf.is_config(node) and OmegaConf.is_interpolation(node, key):
            continue  # a model fact not read yet (``${model.max_context}``)
        edges = fields[key].metadata.get(RANGE)
        if not (_fits(value, kind) and (not edges or _inside(value, edges, facts))):
            finite = " (finite)" if isinstance(value, float) and not math.isfinite(value) else ""
            raise KVBenchError(f"{prefix}.{key} must be {_wanted(kind, edges, facts)}{finite}, got {value!r}")
        target = value.get("_target_") if isinstance(value, DictConfig | dict) else None
        nested = target_class(target) if target else None
        if nested is not None and dataclasses.is_dataclass(nested):
            check_node(value, nested, f"{prefix}.{key}", facts)


def clamp_notes(node: DictConfig, facts: Mapping, prefix: str = "method") -> list[str]:
    """One note for each option of ``node`` (a method) above the model fact its field's ``clamp``
    names: the method clamps it, and the run says so (``runners.setup.build.build_method``)."""
    cls = target_class(node.get("_target_"))
    if cls is None or not dataclasses.is_dataclass(cls):
        return []
    notes = []
    for f in dataclasses.fields(cls):
        value, fact = node.get(f.name), f.metadata.get(CLAMP)
        if isinstance(value, DictConfig) and "_target_" in value:
            notes += clamp_notes(value, facts, f"{prefix}.{f.name}")
        elif fact and isinstance(value, int) and facts.get(fact) is not None and value > facts[fact]:
            notes.append(
                f"{prefix}.{f.name}={value} is above {FACTS[fact]} ({facts[fact]}): the method clamps it "
                "to each prompt's length"
            )
    return notes


def check_target(node: DictConfig, group: str, facts: Mapping | None = None) -> None:
    """:func:`check_node` for a method or task node, against the class its ``_target_`` names (an
    unknown target is left to the build, which names the known ones)."""
    cls = target_class(node.get("_target_"))
    if cls is not None and dataclasses.is_dataclass(cls):
        check_node(node, cls, group, facts)


def model_facts(model: DictConfig, text: object) -> dict:
    """The facts of the model a range may name (:data:`FACTS`): ``max_context`` (``model.max_context``,
    filled by ``runners.models.loading.resolve_model_config``) and ``head_dim`` of its text config."""
    heads = getattr(text, "num_attention_heads", None)
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
    return {"max_context": model.get("max_context"), "head_dim": head_dim}


def check_config(cfg: DictConfig) -> None:
    """The door: the ``method``, ``task``, ``quant`` and ``runner`` nodes checked against their schema
    (``runners.setup.options`` for the last two), before anything is built or read.

    Raises
    ------
    KVBenchError
        As :func:`check_node`, for the first bad option.
    """
    check_target(cfg.method, "method")
    check_target(cfg.task, "task")
    check_node(cfg.get("quant") or {}, QuantOptions, "quant", label=f"quant={quant_of(cfg)}")
    runner = RUNNER_OPTIONS.get(cfg.runner.name)
    if runner is not None:
        check_node(cfg.runner, runner, "runner", label=f"runner={cfg.runner.name}")
