"""``quant=bf16``: keys and values held in bfloat16, whatever the model's dtype (half the bytes of a
float32 cache, a bfloat16 model's unchanged); read back in the model's dtype. The smallest codec
(docs/extending.md, "A storage kind")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from methods.quant.registry import register_codec


@register_codec("bf16")
@dataclass(frozen=True)
class BF16Codec:
    """Keys or values rounded to bfloat16 (module docstring)."""

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Field ``<name>.bf16``: ``x`` ``[..., head_dim]`` in bfloat16."""
        return {f"{name}.bf16": x.to(torch.bfloat16)}

    def decode(self, name: str, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``[..., head_dim]`` bfloat16 (the store reads it in the model's dtype)."""
        return fields[f"{name}.bf16"]
