"""FullKV: the uncompressed reference, run through the same seam as every method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from methods.seam.contract import CompressionMethod, Traits


@dataclass
class FullKV(CompressionMethod):
    """Keep every token (no eviction, no merging); the budget is ignored.

    Its greedy output equals ``model.generate`` (tests/test_generate.py), which validates the seam.
    """

    name: ClassVar[str] = "fullkv"
    TRAITS: ClassVar[Traits] = Traits(
        compresses=False, budget_applies=False, decode_rule=False, decode_input="none", uses_log_weight=False
    )
