"""Key re-rotation (kvpress's ``KeyRerotationPress``; transformers' former ``SinkCache``, FINCH): after
compression, the kept keys are re-rotated to contiguous positions.

A wrapper over any score-then-evict method, allocators included (``methods.wrap``; kvpress: any
``ScorerPress``). kvpress re-rotates the kept keys of the compressed prompt to positions ``0 .. k - 1``
and its pipeline then gives the question and the generated tokens positions ``k, k + 1,
...`` (``pipeline.py``: ``context_length = cache.get_seq_length()`` for a ``KeyRerotationPress``).
RoPE attention depends only on relative positions, so KVBench, whose new tokens keep their true
positions (``n, n + 1, ...`` after an ``n``-token prompt), re-rotates the kept keys of each head to
``n - k .. n - 1`` instead: every distance between a kept key and a later query is kvpress's. Exact
for RoPE whose angles are linear in the position (``methods.seam.rope``). The keys are rotated once,
after the wrapped method's prefill, as kvpress; tokens the wrapped method evicts while decoding leave
gaps. ``positions`` keep the true token indices (the wrapped method's rule reads them); slots without
a position (-1: merged or padding) are not turned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.seam.layer import CompressedLayer
from methods.seam.rope import rotate
from methods.snapkv import SnapKV
from methods.wrap import ScorerWrapper


def contiguous_shift(positions: torch.Tensor, seen: int) -> torch.Tensor:
    """Per slot, how far forward to turn its key so that each head's kept tokens sit at ``seen - k ..
    seen - 1`` in position order: ``[batch, kv_heads, slots]`` int64 (0 where ``positions`` is -1)."""
    real = positions >= 0
    rank = torch.where(real, positions, positions.new_tensor(1 << 62)).argsort(-1).argsort(-1)
    return torch.where(real, seen - real.sum(-1, keepdim=True) + rank - positions, 0)


@dataclass
class KeyRerotation(ScorerWrapper):
    """A scorer whose kept prompt keys are re-rotated to contiguous positions (module docstring).

    Parameters
    ----------
    scorer : ScoreEvict
        The wrapped score-then-evict method, allocators included (kvpress: any ``ScorerPress``;
        default SnapKV as kvpress runs it).

    Raises
    ------
    ValueError
        For a scorer that ranks no tokens or already re-rotates (StreamingLLM with ``rerotate``); from
        :meth:`check_model`, for a model without rotary embeddings.
    """

    name: ClassVar[str] = "key_rerotation"

    scorer: ScoreEvict = field(default_factory=lambda: SnapKV(window_size=64, kernel_size=5, pooling="avg"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if getattr(self.scorer, "rerotate", False):
            raise ValueError(f"{self.scorer.label} already re-rotates its keys (set its rerotate=false)")

    def check_model(self, config) -> None:
        """The scorer's checks; the model must have rotary position embeddings."""
        super().check_model(config)
        if getattr(config, "rope_parameters", None) is None and getattr(config, "rope_theta", None) is None:
            raise ValueError("key_rerotation needs a model with rotary position embeddings (RoPE)")

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """The scorer's prefill, then :meth:`rerotate`."""
        self.scorer.prefill(layer, query, scaling)
        self.rerotate(layer)

    def rerotate(self, layer: CompressedLayer) -> None:
        """Turn each kept key forward by :func:`contiguous_shift` (float32, one KV head at a time).

        Raises
        ------
        ValueError
            On a layer without rotary embeddings.
        """
        shift = contiguous_shift(layer.store.positions, layer.get_seq_length())
        if not bool(shift.any()):  # nothing was evicted
            return
        if layer.spec.rotary is None:
            raise ValueError("key_rerotation needs a model with rotary position embeddings (RoPE)")
        turns = torch.arange(int(shift.max()) + 1, device=shift.device)
        cos, sin = layer.spec.rotary.table(turns, torch.float32)
        keys = torch.empty_like(layer.keys)
        for h in range(keys.shape[1]):
            turn = shift[:, h]
            keys[:, h] = rotate(layer.keys[:, h].float(), cos[turn], sin[turn]).to(keys.dtype)
        layer.store.write("keys", keys)
