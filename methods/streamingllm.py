"""StreamingLLM (Xiao et al., ICLR 2024; mit-han-lab/streaming-llm): attention sinks + recent window.

The cache keeps the first ``n_sink`` tokens (attention sinks) and the most recent tokens up to the
budget, at prefill and at every decode step. With ``rerotate`` (the paper's behaviour, Sec. 3.2)
positions are assigned by cache index, so relative distances never exceed the cache size.
Because the recent window is contiguous, that is the same as keeping every key at its original
position and moving only the sinks forward by the number of evicted tokens; the sinks are
re-rotated on the fly at each decode step (``methods.seam.rope.LayerRotary``, the layer's own RoPE).
A score-then-evict rule (``methods.evict``): protected = the sinks and the recent window, which
fill the budget; ranked by position.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer


@dataclass
class StreamingLLM(ScoreEvict):
    """Attention sinks + recent window.

    Parameters
    ----------
    n_sink : int
        Initial tokens always kept (4, the paper's setting).
    rerotate : bool
        Positions by cache index (True, the paper) or original positions (False, as
        KVCache-Factory's LongBench baseline).

    Raises
    ------
    ValueError
        For ``n_sink`` < 0.

    Notes
    -----
    A budget of ``n_sink`` slots or fewer (short prompts at small fractional budgets) keeps
    ``budget - 1`` sinks, so the newest token always has a slot.
    """

    name: ClassVar[str] = "streamingllm"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, decode_input="none", state_fill={})

    n_sink: int = 4
    rerotate: bool = True

    def __post_init__(self) -> None:
        if self.n_sink < 0:
            raise ValueError(f"n_sink must be >= 0, got {self.n_sink}")

    def sinks(self, budget: int | None) -> int:
        """Attention sinks kept under ``budget`` slots: ``n_sink``, at most ``budget - 1``."""
        return self.n_sink if budget is None else max(0, min(self.n_sink, budget - 1))

    def protected(self, bound: int) -> tuple[int, int]:
        """The sinks, and the recent window over the rest of the budget. The sinks stay in the
        first slots (an eviction moves the newest slot into the victim's place, never a sink's)."""
        sinks = self.sinks(bound)
        return sinks, bound - sinks

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, None]:
        """Fused attention over the slots; with ``rerotate`` the sinks' stored keys are first moved
        forward by the number of evicted tokens. Their original keys are kept in
        ``layer.aux["sink_keys"]`` ``[batch, kv_heads, sinks, head_dim]`` (counted in the KV bytes)
        and re-rotated in place, so no copy of the cache is made. Shapes as
        ``CompressionMethod.decode_attention``.

        Raises
        ------
        ValueError
            With ``rerotate`` on a model without rotary embeddings.
        """
        n = layer.plan.first
        if self.rerotates(layer):
            if layer.spec.rotary is None:
                raise ValueError("StreamingLLM rerotate=true needs a model with rotary embeddings")
            self.keep_sink_keys(layer)
            sinks = torch.arange(n, device=layer.keys.device).expand(*layer.store.positions.shape[:2], n)
            shift = layer.tokens_seen() - layer.store.n_slots  # ``evicted``, a device count when compiled
            layer.store.replace(sinks, keys=layer.spec.rotary.rerotate(layer.aux["sink_keys"], shift))
        return super().decode_attention(layer, query, scaling)

    def rerotates(self, layer: CompressedLayer) -> bool:
        """Whether this step moves the sinks: ``rerotate``, sinks kept, and tokens evicted."""
        return self.rerotate and layer.plan.first > 0 and layer.get_seq_length() > layer.store.n_slots

    def keep_sink_keys(self, layer: CompressedLayer) -> None:
        """At the first eviction, while the stored sinks are still the originals: copy them into
        ``layer.aux["sink_keys"]`` ``[batch, kv_heads, sinks, head_dim]`` (once)."""
        if "sink_keys" not in layer.aux:
            layer.aux["sink_keys"] = layer.keys[:, :, : layer.plan.first].clone()

    def prepare_graph_step(self, layer: CompressedLayer, k: int) -> None:
        """Keep the sinks' original keys eagerly before the compiled step that would first re-rotate
        them (inside a CUDA graph the copy would be overwritten by the next replay)."""
        if self.rerotates(layer) and layer.spec.rotary is not None:
            self.keep_sink_keys(layer)
