"""FullKV: the uncompressed reference, run through the same seam as every method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from methods.seam.contract import CompressionMethod


@dataclass
class FullKV(CompressionMethod):
    """Keep every token (no eviction, no merging); the budget is ignored.

    Its greedy output equals ``model.generate`` (tests/test_generate.py), which validates the seam.
    """

    name: ClassVar[str] = "fullkv"
    compresses: ClassVar[bool] = False
    decode_input: ClassVar[str] = "none"
    uses_log_weight: ClassVar[bool] = False
