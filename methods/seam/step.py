"""The step order of the cache seam, written once (ZSMerge Algorithm 1: append, attend, update
scores, evict/merge), for every caller: the attention function (``methods.seam.attention``), the error
runner's shadow caches (``runners.measure.attention_error``) and the decode-overhead profiler
(``scripts/profile_decode.py``).

Each layer follows its own rule (``CompressedCache.rules``): the run's method, or the sliding-window
rule on a sliding layer (``methods.seam.sliding``). The token(s) of the call are already appended to
the layer (``CompressedLayer.update``) when these functions run.
"""

from __future__ import annotations

import torch

from kernels.prefill import prefill_attention
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer


def prefill_step(
    rule: CompressionMethod,
    layer: CompressedLayer,
    query: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor | None:
    """The prompt's step on one layer: attention output over the whole prompt (when ``key`` and
    ``value`` are given; :func:`prefill_attention`), then the layer's rule plans the layer
    (``layer.plan``) and scores and compresses it.

    Parameters
    ----------
    rule : CompressionMethod
        The layer's rule.
    layer : CompressedLayer
        Holds the whole prompt (not yet prefilled).
    query : torch.Tensor
        ``[batch, q_heads, prompt, head_dim]`` post-RoPE.
    key, value : torch.Tensor | None
        ``[batch, kv_heads, prompt, head_dim]``, or None to skip the output (shadow caches).
    scaling : float
        Softmax scale.

    Returns
    -------
    torch.Tensor | None
        ``[batch, q_heads, prompt, head_dim]``, or None without ``key``/``value``.
    """
    out = None
    if key is not None and value is not None:
        out = prefill_attention(query, key, value, scaling, layer.spec.window, layer.spec.softcap)
    layer.plan = rule.plan(layer)
    rule.prefill(layer, query, scaling)
    return out


def prepare_step(rule: CompressionMethod, layer: CompressedLayer, k: int = 1) -> None:
    """Before a compiled decode step of ``k`` tokens on one layer, eagerly
    (``CompressedCache.prepare_graph_step``, the profiler's compiled step): the store grows now if the
    step's append would (``SlotStorage.make_room``), the layer counts the step's tokens
    (``CompressedLayer._count_ahead``), the rule creates the ``aux`` state the step would
    (``CompressionMethod.prepare_graph_step``), and the store counts the step's slots
    (``SlotStorage.count_ahead``): a growing layer (no decode-time bound, nothing handed to its rule)
    then appends at a device count and attends over its whole capacity with a validity mask, so the
    step's graph reads no host integer that changes per step and compiles once."""
    layer.store.make_room(k)
    layer._count_ahead(k)
    rule.prepare_graph_step(layer, k)
    layer.store.count_ahead(k, layer.plan.bound is None and rule.traits.needs == "none")


def update(rule: CompressionMethod, layer: CompressedLayer, scores: torch.Tensor | None) -> None:
    """Second half of a decode step (after the rule's ``decode_attention``): the rule updates its
    scores from this step and evicts/merges to its bound; nothing for a prompt-only rule."""
    if not rule.traits.prompt_only:
        rule.decode_step(layer, scores)


def decode_step(
    rule: CompressionMethod, layer: CompressedLayer, query: torch.Tensor, scaling: float
) -> torch.Tensor:
    """One decode step on one layer: attention of ``query`` ``[batch, q_heads, 1, head_dim]`` over the
    layer's slots (``CompressionMethod.decode_attention``), then :func:`update`; returns the output
    ``[batch, q_heads, 1, head_dim]``."""
    out, scores = rule.decode_attention(layer, query, scaling)
    update(rule, layer, scores)
    return out


def layer_step(
    rule: CompressionMethod,
    layer: CompressedLayer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """One attention call on one layer, by what the layer holds: the prompt (:func:`prefill_step`), a
    decode step (:func:`decode_step`) or a chunk of tokens appended to a compressed layer.

    A chunk (a question after its context was compressed, ``task.query_aware=false``): each token in
    turn is appended and takes one :func:`decode_step`, so it attends to the kept slots and to the
    chunk's earlier tokens (causal), at positions that continue the prompt's, and the layer's rule
    then runs as in any decode step. A method that only compresses the prompt keeps the whole chunk
    (the output equals causal attention of the chunk over the kept slots and itself); a method whose
    budget holds in decoding evicts/merges to its bound after each token, as it does while generating
    (docs/methods.md, "The question after compression").

    Each layer runs its tokens in order before the next layer starts; this equals feeding the chunk
    one token per forward, since a layer's slots depend only on its own keys, values and attention.

    Parameters
    ----------
    rule : CompressionMethod
        The layer's rule.
    layer : CompressedLayer
        The layer; for a chunk, a prefilled one (the chunk not yet appended: ``CompressedLayer.update``
        defers it).
    query : torch.Tensor
        ``[batch, q_heads, q_len, head_dim]`` post-RoPE.
    key, value : torch.Tensor
        ``[batch, kv_heads, q_len, head_dim]``: the new tokens' keys (post-RoPE) and values.
    scaling : float
        Softmax scale.

    Returns
    -------
    torch.Tensor
        ``[batch, q_heads, q_len, head_dim]``.
    """
    if layer.plan is None:
        return prefill_step(rule, layer, query, key, value, scaling)
    if query.shape[2] == 1:
        return decode_step(rule, layer, query, scaling)
    rows = []
    for i in range(query.shape[2]):
        layer.update(key[:, :, i : i + 1], value[:, :, i : i + 1])
        rows.append(decode_step(rule, layer, query[:, :, i : i + 1], scaling))
    return torch.cat(rows, dim=2)
