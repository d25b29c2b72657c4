"""FINCH (Corallo & Papotti 2024, "FINCH: Prompt-guided Key-Value Cache Compression for Large Language
Models", TACL, Sec. 3; kvpress's ``FinchPress``): SnapKV-style selection whose observation window is the
question.

The prompt ends with the question (``w`` tokens; kvpress finds it by a delimiter token between context
and question, which its hook removes from the input). The question's queries vote for the context's
tokens: the attention of question query ``i`` (0-based; causal, softmax over the whole prompt, mean
over the KV head's query heads), multiplied by ``n - w + i`` (kvpress's ``normalize_scores``: the
count of keys that query sees, less one), averaged over the question; no pooling. The question is kept
and the context's top ``keep - w`` tokens with it, per KV head. ``chunk_length``: kvpress's chunked
variant, each chunk of the prompt (the question scoring highest) keeping ``max(1, int(c x share))``
of its ``c`` tokens. kvpress re-rotates the kept keys by default (``rerotate_keys``): here that is
``key_rerotation`` over ``finch``; the kept tokens are the same. Once, at prefill; decoding appends.

The window: ``window_size``, or (None) the question's tokens at the end of the compressed prompt
(``layer.question``: a query-aware run of a task with a question, ``runners.quality.question_tokens``;
kvpress's evaluation likewise requires ``query_aware``). A run without one (the question appended after
compression, or no question) falls back to the last :data:`NO_QUESTION_WINDOW` tokens (kvpress refuses).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.checks import option
from methods.evict import ScoreEvict
from methods.scoring import window_attention
from methods.seam.contract import CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import budget_share

#: The window when the run gives no question (kvpress's SnapKV window)
NO_QUESTION_WINDOW = 64


def finch_scores(probs: torch.Tensor, prompt: int) -> torch.Tensor:
    """FINCH's context scores ``[batch, kv_heads, prompt - w]``: the question's attention ``probs``
    ``[batch, kv_heads, w, prompt]`` (group means) on the context, row ``i`` times ``prompt - w + i``,
    averaged over the ``w`` rows."""
    w = probs.shape[2]
    counts = torch.arange(prompt - w, prompt, device=probs.device, dtype=probs.dtype)
    return (probs[..., : prompt - w] * counts[:, None]).mean(dim=2)


@dataclass
class Finch(ScoreEvict):
    """FINCH (module docstring).

    Parameters
    ----------
    window_size : int | None
        Question tokens at the end of the prompt; None: the run's question (module docstring).
    chunk_length : int | None
        kvpress's chunked selection (module docstring); None: the whole prompt at once (kvpress's
        default).
    normalize_scores : bool
        Multiply each question query's attention by its key count (kvpress's default, True).

    Raises
    ------
    ValueError
        For a window or chunk length < 1.
    """

    name: ClassVar[str] = "finch"
    TRAITS: ClassVar[Traits] = replace(
        ScoreEvict.TRAITS, prompt_only=True, decode_rule=False, decode_input="none"
    )

    window_size: int | None = None
    chunk_length: int | None = option(None, low=1, high="max_context")
    normalize_scores: bool = True

    def __post_init__(self) -> None:
        if self.window_size is not None and self.window_size < 1:
            raise ValueError(f"window_size must be >= 1 or null, got {self.window_size}")
        if self.chunk_length is not None and self.chunk_length < 1:
            raise ValueError(f"chunk_length must be >= 1 or null, got {self.chunk_length}")

    def window(self, layer: CompressedLayer) -> int:
        """The question's tokens in this layer's prompt: ``window_size``, else ``layer.question``, else
        :data:`NO_QUESTION_WINDOW`; at most the prompt less one token."""
        w = self.window_size if self.window_size is not None else getattr(layer, "question", None)
        return min(NO_QUESTION_WINDOW if w is None else w, layer.store.n_slots - 1)

    def plan(self, layer: CompressedLayer):
        """The budget with the question protected (all of it the budget can hold)."""
        plan = CompressionMethod.plan(self, layer)
        if plan.fits(layer.store.n_slots):
            return plan
        return replace(plan, recent=min(self.window(layer), plan.keep))

    def prefill_scores(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """:func:`finch_scores` on the context, the question above them all (kvpress: the context's
        maximum + 1); None when the prompt fits."""
        n = layer.store.n_slots
        if layer.plan.fits(n):
            return None
        w = self.window(layer)
        probs = window_attention(query, layer.keys, w, scaling, layer.spec.softcap)
        if self.normalize_scores:
            context = finch_scores(probs, n)
        else:
            context = probs[..., : n - w].mean(dim=2)
        top = context.amax() + 1
        return torch.cat([context, top.expand(*context.shape[:2], w)], dim=-1)

    def prefill_keep(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> torch.Tensor | None:
        """The question and the context's best (:meth:`ScoreEvict.prefill_keep`), or with
        ``chunk_length`` each chunk's best ``max(1, int(c x share))`` by the same scores."""
        if self.chunk_length is None:
            return super().prefill_keep(layer, query, scaling)
        n = layer.store.n_slots
        if layer.plan.fits(n):
            return None
        scores = self.prefill_scores(layer, query, scaling)
        share = budget_share(layer.share, layer.budget, n)
        parts = []
        for start in range(0, n, self.chunk_length):
            chunk = scores[..., start : start + self.chunk_length]
            k = max(1, int(chunk.shape[-1] * share))
            parts.append(start + chunk.topk(k, dim=-1).indices.sort(dim=-1).values)
        return torch.cat(parts, dim=-1)
