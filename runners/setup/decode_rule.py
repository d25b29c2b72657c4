"""What a compressing method does while decoding, as the run asks: the ``decode_budget`` rule (the
top-level option, the method config's, or the task protocol's) applied to the built method and
recorded in the run (``decoding``, ``paper_decoding``)."""

from __future__ import annotations

import dataclasses

from omegaconf import open_dict

from methods import CompressionMethod
from runners.setup.settings import RunSettings
from tasks.errors import KVBenchError


def decode_rule(settings: RunSettings) -> bool | None:
    """The run's ``decode_budget`` (``CompressionMethod.decode_budget``): the top-level option, else
    the method config's, else the task protocol's (``task.decode_budget``: RULER's false, the kvpress
    leaderboard's rule); None leaves the method's paper rule.

    Raises
    ------
    KVBenchError
        For a value that is not true, false or null.
    """
    for value in (
        settings.decode_budget,
        settings.method.get("decode_budget"),
        settings.task.get("decode_budget"),
    ):
        if value is not None and not isinstance(value, bool):
            raise KVBenchError(f"decode_budget must be true, false or null, got {value!r}")
        if value is not None:
            return value
    return None


def apply_decode_rule(settings: RunSettings, method: CompressionMethod) -> CompressionMethod:
    """``method`` under the run's :func:`decode_rule`, which is written into its method node
    (``RunSettings.method``, so the run is stored under the rule it ran, whether asked for at the top
    level or in the method config).
    FullKV, whose decoding no rule changes, is left as it is."""
    rule = decode_rule(settings)
    if rule is None or not method.traits.compresses or method.decode_budget == rule:
        return method
    with open_dict(settings.method):
        settings.method.decode_budget = rule
    return dataclasses.replace(method, decode_budget=rule)


def decoding_protocol(method: CompressionMethod) -> dict:
    """What a run records of its method's decoding: ``decoding`` (``prompt-only``: the prompt
    compressed once, every later token kept; ``decode-time``: the method's rule runs at every decode
    step) and ``paper_decoding``, the method's own rule; both None for FullKV."""
    if not method.traits.compresses:
        return {"decoding": None, "paper_decoding": None}

    def name(prompt_only: bool) -> str:
        return "prompt-only" if prompt_only else "decode-time"

    return {
        "decoding": name(method.traits.prompt_only),
        "paper_decoding": name(method.paper().traits.prompt_only),
    }
