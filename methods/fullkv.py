"""FullKV: the uncompressed reference, run through the same seam as every method."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from methods.seam.contract import CompressionMethod
from methods.seam.traits import NO_DECODE_RULE, Traits


@dataclass
class FullKV(CompressionMethod):
    """Keep every token (no eviction, no merging); the budget is ignored.

    Its greedy output equals ``model.generate`` (tests/test_generate.py), which validates the seam.
    """

    name: ClassVar[str] = "fullkv"
    TRAITS: ClassVar[Traits] = replace(NO_DECODE_RULE, compresses=False, budget_applies=False)
