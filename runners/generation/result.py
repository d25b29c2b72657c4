"""What one prompt's generation returns (:class:`GenerationResult`): tokens, timings, the realised
compression and the cache's bytes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationResult:
    """Output of :func:`greedy_generate` for one prompt (batch of 1).

    Attributes
    ----------
    tokens : list[int]
        Generated token ids (the EOS token, if reached, included).
    prefill_seconds : float
        Wall time of the prompt forward, compression included, and of the question chunk of a
        query-agnostic run (seconds): the time to the first token.
    step_seconds : list[float]
        Wall time of each decode step (seconds); ``len(tokens) - 1`` entries.
    slots : list[int]
        Slots per layer at the end of generation.
    prefill_slots : list[float]
        Attendable slots per layer right after the prefill (mean over heads, padding excluded):
        the realised prompt compression (before a query-agnostic run's question chunk).
    prefill_tokens : int
        Tokens the prefill compressed: the prompt, or the context before the question.
    kv_bytes : int
        Key/value bytes held by the cache at the end (all layers).
    allocated_bytes : int
        Bytes of the storage behind the cache at the end (buffer capacity and a ragged layer's
        index tensors included): the memory the cache really occupies.
    prefill_head_slots : list[tuple[int, float, int]]
        Per layer ``(min, mean, max)`` of the slots its KV heads hold right after the prefill (they
        differ under a head-adaptive allocator: AdaKV, DuoAttention).
    state_bytes : int
        Bytes of the method's per-slot state at the end (all layers).
    fullkv_bytes : int
        Key/value bytes the model's own uncompressed cache would hold for the same tokens
        (sliding-window layers: the last ``window - 1`` tokens).
    budget : int | None
        Resolved slot budget.
    counters : dict[str, int]
        The method's event counters over all layers (``Traits.counters``).
    """

    tokens: list[int]
    prefill_seconds: float
    step_seconds: list[float] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    prefill_slots: list[float] = field(default_factory=list)
    prefill_tokens: int = 0
    kv_bytes: int = 0
    allocated_bytes: int = 0
    prefill_head_slots: list[tuple[int, float, int]] = field(default_factory=list)
    state_bytes: int = 0
    fullkv_bytes: int = 0
    budget: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
