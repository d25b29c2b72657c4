"""Non-causal chunked attention (Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache
Compression with Approximate Leverage Scores", arXiv 2507.08143; kvpress's ``NonCausalAttnPress``).

The prompt is cut into chunks of ``chunk_size`` tokens; within each chunk every query attends to every
key of the chunk, before and after it (no causal mask, no softmax scale: ``softmax(q k^T)`` over the
chunk, in float32). A token's attention is the sum over the chunk's queries, averaged over the query
heads of its KV group, weighted by ``||v||``, smoothed by an average pool of width 3 (zero padding
counted) and z-scored over the layer's heads and tokens. As ``non_causal_attention_press.py``, the
last chunk is padded to ``chunk_size`` with zero queries and keys: the padded keys take attention at
logit 0 and each padded query spreads ``1 / chunk_size`` over the chunk's keys. Prompt only (kvpress:
prefill only); nothing protected.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.checks import check_bounds, option
from methods.evict import ScoreEvict
from methods.leverage_score import z_score
from methods.scoring import group_queries, pool_scores
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer


def chunk_attention(query: torch.Tensor, keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Column sums of the non-causal attention inside each chunk (kvpress's ``non_causal_chunked_attn``).

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, n, head_dim]`` post-RoPE queries.
    keys : torch.Tensor
        ``[batch, kv_heads, n, head_dim]`` post-RoPE keys of the same ``n`` tokens.
    chunk_size : int
        Tokens per chunk; the last chunk is padded with zero queries and keys to this size.

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, n]`` float32: per key, the attention summed over its chunk's queries (the
        padded ones included), averaged over the query heads of its group.
    """
    n = keys.shape[2]
    pad = -n % chunk_size
    q = F.pad(group_queries(query, keys.shape[1]).float(), (0, 0, 0, pad))  # [b, h, g, n + pad, d]
    k = F.pad(keys.float(), (0, 0, 0, pad))
    sums = []
    for start in range(0, n + pad, chunk_size):  # one chunk at a time: chunk_size^2 logits per head
        qc, kc = q[..., start : start + chunk_size, :], k[:, :, start : start + chunk_size]
        probs = torch.softmax(torch.einsum("bhgqd,bhkd->bhgqk", qc, kc), dim=-1)
        sums.append(probs.sum(dim=-2))
    return torch.cat(sums, dim=-1)[..., :n].mean(dim=2)


def non_causal_scores(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """kvpress's ``NonCausalAttnPress`` score of ``n`` tokens: :func:`chunk_attention` times ``||v||``,
    average-pooled (width 3), z-scored (:func:`methods.leverage_score.z_score`).

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, n, head_dim]`` post-RoPE.
    keys, values : torch.Tensor
        ``[batch, kv_heads, n, head_dim]``, keys post-RoPE.
    chunk_size : int
        Tokens per chunk.

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, n]`` float32.
    """
    scores = chunk_attention(query, keys, chunk_size) * values.float().norm(dim=-1)
    return z_score(pool_scores(scores, 3, "avg"))


@dataclass
class NonCausalAttn(ScoreEvict):
    """Keep the tokens the prompt's queries attend to most in non-causal chunked attention, per KV head.

    Parameters
    ----------
    chunk_size : int
        Tokens per chunk (kvpress: 256).

    Raises
    ------
    ValueError
        For ``chunk_size`` < 1.
    """

    name: ClassVar[str] = "non_causal_attn"
    TRAITS: ClassVar[Traits] = replace(
        ScoreEvict.TRAITS, prompt_only=True, decode_rule=False, decode_input="none"
    )

    chunk_size: int = option(256, low=1)

    def __post_init__(self) -> None:
        check_bounds(self)

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """:func:`non_causal_scores` ``[batch, kv_heads, prompt]`` of every prompt token."""
        return non_causal_scores(query, layer.keys, layer.values, self.chunk_size)
