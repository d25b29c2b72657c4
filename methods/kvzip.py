"""KVzip (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
arXiv:2505.23416; snu-mllab/KVzip; kvpress ``KVzipPress``): keep the pairs the model needs to
repeat its context.

After the prefill the model is asked to repeat the context: the chat template's user turn "Repeat the
previous context exactly." and the context itself, in chunks of ``chunk_size`` tokens (a later chunk
asks to resume from the previous chunk's last ``resume_tokens`` tokens), fed against the cached
context, which these forwards leave unchanged (``methods.probing``, ``runners.generation.probe``). A cached
pair scores the largest attention any reconstruction query of its KV head's group gives it, the softmax
taken over the ``n_sink`` first pairs, the chunk's context and the chunk's own causal part (Sec. 3.2;
the official ``KVScore._get_score``). Each layer then keeps the top ``heads x B`` scores across its
heads, in ragged heads (the memory freed, where kvpress masks); with ``layerwise=false`` the top
``layers x heads x B`` across all layers and heads (kvpress's default). The ``n_sink`` first tokens
and the chat template before the context (the system prompt, which no chunk repeats) are kept, as
the official code keeps its system prompt. KVzip+ (``kvzip_plus_normalization``, kvpress's
``KVzipPress`` option of that name) weighs each probability before the maximum by the pair's
``||v W_o^h||_2`` through its query head's slice of ``o_proj`` over the query token's attention-input
norm ``||h||_2``. The preset ``kvzip_kvpress`` (``keep_head=false``, ``count_pairs=true``) selects as
kvpress's ``KVzipPress.compress_post``: the template head's length skipped whether or not the prompt
starts with it, its tokens after the sinks scored 0 (evicted first), and ``int(ratio x pairs)`` pairs
evicted. docs/methods.md, "KVzip", lists the choices.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from kernels.prefill import group_queries, grouped_logits, logits_buffer
from methods.checks import option
from methods.criticalkv import output_norm
from methods.kvzip_prompt import ReconstructionPrompt
from methods.probing import Probe, Probing
from methods.scoring import mask_future_block_
from methods.seam.architecture import UnsupportedArchitectureError
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import budget_share
from methods.seam.traits import NO_DECODE_RULE, Traits


@dataclass
class KVzip(Probing, CompressionMethod):
    """KVzip with kvpress's defaults (module docstring).

    Parameters
    ----------
    n_sink : int
        First tokens always kept, and in every reconstruction softmax (attention sinks).
    layerwise : bool
        True: every layer keeps ``heads x B``; False: the budget is shared across layers too.
    chunk_size : int
        Context tokens per reconstruction chunk (kvpress: 2048; the official code: 2000).
    resume_tokens : int
        Tokens of the previous chunk a later chunk's instruction ends with.
    prompt : ReconstructionPrompt | None
        The prompt's token ids; set by :meth:`attach_tokenizer` (the runners call it).
    kvzip_plus_normalization : bool
        KVzip+ (module docstring): probabilities times ``||v W_o^h||_2 / ||h||_2`` before the maximum.
    keep_head : bool
        True: the chat template before the context (its system prompt; no chunk repeats it) is kept, as
        the official code keeps its system prompt, and skipped only where the prompt starts with it.
        False (kvpress): skipped always (kvpress's ``prefix_length``), its tokens after the sinks score
        0, so they are evicted first.
    count_pairs : bool
        False: ``heads x B`` pairs kept per layer (``B`` the per-head budget). True (kvpress):
        ``int(ratio x pairs)`` evicted of the pooled pairs (all layers' heads, or each layer's with
        ``layerwise``), ``ratio = 1 -`` the share the budget was floored from.

    Raises
    ------
    ValueError
        For ``n_sink`` or ``chunk_size`` < 1 or ``resume_tokens`` < 0 (every ragged head must hold at
        least one slot: its sinks).
    """

    name: ClassVar[str] = "kvzip"
    TRAITS: ClassVar[Traits] = replace(
        NO_DECODE_RULE,
        prompt_only=True,
        ragged_heads=True,
        probes=True,
        state_fill={"scores": float("inf")},  # a token no chunk repeats (the template's head) is kept
    )

    n_sink: int = option(4, low=1, high="max_context")
    layerwise: bool = False
    chunk_size: int = option(2048, low=1)
    resume_tokens: int = option(8, low=0, high="max_context")
    prompt: ReconstructionPrompt | None = None
    kvzip_plus_normalization: bool = False
    keep_head: bool = True
    count_pairs: bool = False

    def __post_init__(self) -> None:
        if self.n_sink < 1 or self.chunk_size < 1 or self.resume_tokens < 0:
            raise ValueError(
                f"need n_sink >= 1, chunk_size >= 1, resume_tokens >= 0; got {self.n_sink}, "
                f"{self.chunk_size}, {self.resume_tokens}"
            )

    def attach_tokenizer(self, tokenizer, template_kwargs: dict) -> None:
        """The reconstruction prompt in the tokenizer's ids (:meth:`ReconstructionPrompt.from_tokenizer`)."""
        self.prompt = ReconstructionPrompt.from_tokenizer(tokenizer, template_kwargs)

    def probe_prompts(self, input_ids: torch.Tensor) -> list[Probe]:
        """The reconstruction chunks of the prompt ``[batch, prompt]`` after its template head: each
        ``instruction + tail + context chunk`` ``[batch, tokens]``, its span the chunk's positions.

        Raises
        ------
        ValueError
            Without a :attr:`prompt` (:meth:`attach_tokenizer` not called).
        """
        if self.prompt is None:
            raise ValueError(
                "kvzip needs its reconstruction prompt: call attach_tokenizer(tokenizer, kwargs)"
            )
        b, n = input_ids.shape

        def ids(tokens: tuple[int, ...]) -> torch.Tensor:
            return torch.tensor(tokens, dtype=input_ids.dtype, device=input_ids.device).expand(b, -1)

        head = ids(self.prompt.head)
        start = head.shape[1] if head.shape[1] < n else 0
        if self.keep_head and not torch.equal(input_ids[:, :start], head[:, :start]):
            start = 0
        probes = []
        for first in range(start, n, self.chunk_size):
            stop = min(first + self.chunk_size, n)
            lead = [ids(self.prompt.repeat)]
            if first > start:
                lead = [
                    ids(self.prompt.resume),
                    input_ids[:, max(first - self.resume_tokens, first - self.chunk_size) : first],
                ]
            chunk = torch.cat([*lead, ids(self.prompt.tail), input_ids[:, first:stop]], dim=1)
            probes.append(Probe(chunk, (first, stop)))
        return probes

    def probe(
        self,
        layer: CompressedLayer,
        query: torch.Tensor,
        keys: torch.Tensor,
        scaling: float,
        probe: Probe,
        hidden_norm: torch.Tensor | None = None,
    ) -> None:
        """Scores of the chunk's context span: the largest attention any reconstruction query of the
        group gives each pair, the softmax over the sinks, the span and the chunk's causal part (KVzip+:
        each probability weighed first, :meth:`plus_weights`).

        Raises
        ------
        ValueError
            For KVzip+ without ``hidden_norm`` ``[batch, tokens]``.
        UnsupportedArchitectureError
            For KVzip+ when the attention's ``o_proj`` could not be found.
        """
        start, stop = probe.span
        plus = self.kvzip_plus_normalization
        weights = self.plus_weights(layer, start, stop, hidden_norm) if plus else None
        score = None
        for a, last, span in self.span_log_probs(layer, query, keys, scaling, probe):
            if weights is None:  # the largest probability is exp of the largest log-probability
                best = span.amax(dim=(2, 3)).exp_()
            else:
                column, row = weights
                best = span.exp_().mul_(column[:, :, :, None]).div_(row[:, None, None, a:last, None])
                best = best.amax(dim=(2, 3))
            score = best if score is None else torch.maximum(score, best)
        scores = layer.store.state["scores"].clone()
        scores[:, :, start:stop] = score
        layer.store.write("scores", scores)

    def span_log_probs(
        self, layer: CompressedLayer, query: torch.Tensor, keys: torch.Tensor, scaling: float, probe: Probe
    ) -> Iterator[tuple[int, int, torch.Tensor]]:
        """The reconstruction attention of :meth:`probe` by blocks of 512 probe queries: ``(a, last,
        log_probs)``, ``log_probs`` ``[batch, kv_heads, group, last - a, span]`` float32, the log-softmax
        over the sinks, the span and the chunk's causal part, at the span's pairs."""
        start, stop = probe.span
        sink, n, hkv = min(self.n_sink, start), keys.shape[2], keys.shape[1]
        cached = torch.cat([layer.keys[:, :, :sink], layer.keys[:, :, start:stop], keys], dim=2).float()
        context = cached.shape[2] - n  # the sinks and the span; the chunk's own keys follow
        buffer = logits_buffer(query, min(512, n), cached.shape[2])
        for a in range(0, n, 512):
            q, last = group_queries(query[:, :, a : a + 512], hkv).float(), min(a + 512, n)
            # keys up to the block's last query: the chunk's later tokens take no part in any softmax
            logits = grouped_logits(
                q, cached[:, :, : context + last], scaling, layer.spec.softcap, out=buffer
            )
            mask_future_block_(logits, context + a)  # the chunk's own keys after each query
            yield a, last, torch.log_softmax(logits, dim=-1, out=logits)[..., sink:context]

    def plus_weights(
        self, layer: CompressedLayer, start: int, stop: int, hidden_norm: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KVzip+'s weights (kvpress ``KVzipPress.score_kvzip``): ``||v W_o^h||_2`` ``[batch, kv_heads,
        group, span]`` of the span's values per query head, and the rows' ``||h||_2`` ``[batch,
        tokens]`` float32. Raises as :meth:`probe`."""
        if hidden_norm is None:
            raise ValueError("kvzip_plus_normalization needs the norms of the probe's attention inputs")
        if layer.spec.out_proj is None:
            raise UnsupportedArchitectureError("kvzip_plus_normalization needs the attention's o_proj")
        values = layer.values[:, :, start:stop]
        return output_norm(values, layer.spec.out_proj, ord=2, per_head=True), hidden_norm.float()

    def ranking(self, layer: CompressedLayer) -> torch.Tensor:
        """``[batch, kv_heads, prompt]`` scores with the kept tokens (sinks, and the unrepeated head with
        ``keep_head``) at +inf, at most ``B`` of them per head (the rest of them at 0; the head at 0
        without ``keep_head``)."""
        scores, pos = layer.store.state["scores"], layer.store.positions
        protected = pos < self.n_sink
        if self.keep_head:
            protected = protected | torch.isinf(scores)
        scores = scores.masked_fill(protected | torch.isinf(scores), 0.0)
        return scores.masked_fill(protected & (pos < layer.plan.keep), torch.inf)

    def kept_pairs(self, layers: list[CompressedLayer], heads: list[int]) -> list[int]:
        """Pairs to keep per layer (``layerwise``) or in all ``layers`` together (one entry), the layers
        holding ``heads`` KV heads each: ``heads x B`` per layer, or with ``count_pairs`` kvpress's
        count, the pooled pairs less ``int(ratio x pairs)``."""
        if self.count_pairs:
            pairs = [h * layer.store.n_slots for h, layer in zip(heads, layers, strict=True)]
            first = layers[0]
            ratio = 1.0 - budget_share(first.share, first.budget, first.store.n_slots)
            pools = pairs if self.layerwise else [sum(pairs)]
            return [p - int(p * ratio) for p in pools]
        kept = [h * layer.plan.keep for h, layer in zip(heads, layers, strict=True)]
        return kept if self.layerwise else [sum(kept)]

    def compress(self, layers: list[CompressedLayer]) -> None:
        """Keep the top ``heads x B`` of each layer (``layerwise``) or the top ``sum(heads x B)`` over
        all the layers (:func:`top_mask`), in ragged heads."""
        layers = [lay for lay in layers if lay.plan.keep is not None and lay.store.n_slots > lay.plan.keep]
        if not layers:
            return
        ranked = [self.ranking(layer) for layer in layers]
        budgets = self.kept_pairs(layers, [r.shape[1] for r in ranked])
        if self.layerwise:
            masks = [top_mask(r, k) for r, k in zip(ranked, budgets, strict=True)]
        else:
            masks = top_mask(torch.cat(ranked, dim=1), budgets[0]).split([r.shape[1] for r in ranked], dim=1)
        for layer, keep in zip(layers, masks, strict=True):
            layer.store = layer.store.ragged(keep)


def top_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``[batch, heads, tokens]`` bool: the ``k`` highest ``scores`` of each batch row, over all its
    heads and tokens together (AdaKV's selection across heads, Algorithm 1, without its safeguard)."""
    b = scores.shape[0]
    chosen = scores.reshape(b, -1).topk(k, dim=-1).indices
    mask = torch.zeros(b, scores[0].numel(), dtype=torch.bool, device=scores.device)
    return mask.scatter_(1, chosen, True).view(scores.shape)
