"""Expected Attention (Devoto, Jeblick and Jégou 2025, "Expected Attention: KV Cache Compression by
Estimating Attention from Future Queries Distribution"; kvpress ``ExpectedAttentionPress``).

Future queries are modelled as a Gaussian: the mean ``mu`` and covariance ``Sigma`` of the pre-RoPE
queries seen after the ``n_sink`` first tokens, turned by the RoPE rotation averaged over the next
``n_future_positions`` positions, ``R_bar`` (Sec. 3.2). The expected un-normalised attention of a key
is the Gaussian moment-generating function (Sec. 3.3)::

    z_i = E[exp(s q^T k_i)] = exp(s (R_bar mu)^T k_i + s^2/2 k_i^T R_bar Sigma R_bar^T k_i)

with ``s = d^-1/2`` (the paper's ``mu^T k / sqrt(d) + k^T Sigma k / 2d``; we use the layer's softmax
scale, the same for every family but Gemma's ``query_pre_attn_scalar``); normalised over the cache per
query head, averaged over each KV group and weighted by the value's contribution,
``(a_i + epsilon) ||v_i||`` (kvpress's ``use_vnorm``). The sinks are excluded from the normalisation and
score as their head's best token. The un-rotation uses the layer's own rotary embedding
(``methods.seam.rope``): ``R_bar^T R(-t) k_i`` is the key seen from the next positions ``t+1 .. t+T``.

Decode: the statistics are kept as a running mean and scatter matrix (Welford) of every query seen
after the sinks, prompt and generated (``layer.aux``, counted in the KV bytes: per layer
``q_heads x (head_dim (head_dim + 1) / 2 + head_dim)`` float32, the symmetric scatter matrix stored as
its upper triangle); each step adds the step's query, re-scores every slot with the
future window moved to the new position, and evicts the lowest-scored unprotected token (kvpress's
``DecodingPress`` re-compresses every N steps from a buffer of recent hidden states instead).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from methods.checks import check_bounds, option
from methods.evict import ScoreEvict
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer
from methods.seam.rope import rotate


def pack(matrix: torch.Tensor) -> torch.Tensor:
    """The upper triangle ``[..., d (d + 1) / 2]`` of symmetric ``[..., d, d]`` matrices."""
    i, j = torch.triu_indices(matrix.shape[-1], matrix.shape[-1], device=matrix.device)
    return matrix[..., i, j]


def unpack(packed: torch.Tensor, d: int) -> torch.Tensor:
    """The symmetric ``[..., d, d]`` matrices whose upper triangles are ``packed`` (:func:`pack`)."""
    i, j = torch.triu_indices(d, d, device=packed.device)
    out = packed.new_zeros((*packed.shape[:-1], d, d))
    out[..., i, j] = packed
    out[..., j, i] = packed
    return out


@dataclass
class ExpectedAttention(ScoreEvict):
    """Expected Attention: keep the tokens the future queries' Gaussian is expected to attend to.

    Parameters
    ----------
    n_future_positions : int
        Positions the RoPE rotation is averaged over (``T`` = 512, the paper).
    n_sink : int
        First tokens kept and left out of the statistics and the normalisation (4).
    use_covariance : bool
        Include the covariance term ``k^T Sigma k s^2 / 2`` (True).
    use_vnorm : bool
        Weight by ``||v||`` (True).
    epsilon : float
        Added to the expected attention before the value weighting (0; the paper's LongBench runs 0.02).
    recent : int
        Newest tokens protected (0: the paper, kvpress's press; kvpress's decoding wrapper holds the
        tokens generated since its last compression).

    Raises
    ------
    ValueError
        For ``n_future_positions`` < 1, or ``n_sink``, ``epsilon`` or ``recent`` < 0.
    """

    name: ClassVar[str] = "expected_attention"
    TRAITS: ClassVar[Traits] = replace(ScoreEvict.TRAITS, decode_input="none")

    n_future_positions: int = option(512, low=1)
    n_sink: int = option(4, low=0)
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = option(0.0, low=0)
    recent: int = option(0, low=0)

    def __post_init__(self) -> None:
        check_bounds(self)

    def protected(self, bound: int) -> tuple[int, int]:
        """The ``n_sink`` sinks (at most ``bound - 1``, so the newest token has a slot) and the
        ``recent`` newest tokens (at most the rest of the bound)."""
        sinks = max(0, min(self.n_sink, bound - 1))
        return sinks, min(self.recent, bound - sinks)

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """Statistics of the prompt's queries after the sinks (at least one), then every prompt
        token's score ``[batch, kv_heads, prompt]``, comparable across the heads of the layer."""
        q = query.float()
        rotary = layer.spec.rotary
        if rotary is not None:  # q_s = R(s) q_pre: turn each query back by its position
            cos, sin = rotary.table(torch.arange(q.shape[2], device=q.device), torch.float32)
            q = rotate(q, cos, -sin)
            ahead = torch.arange(1, self.n_future_positions + 1, device=q.device)
            cos, sin = rotary.table(ahead, torch.float32)
            layer.aux["ea_turn"] = torch.stack([cos.mean(0), sin.mean(0)])  # R_bar over 1..T ahead
        q = q[:, :, min(self.n_sink, q.shape[2] - 1) :]
        mean = q.mean(dim=2)
        layer.aux["ea_mean"] = mean
        if self.use_covariance:
            centred = q - mean[:, :, None]
            layer.aux["ea_scatter"] = pack(centred.transpose(-1, -2) @ centred)
        layer.scalars["ea_queries"] = torch.full((), float(q.shape[2]), device=q.device)
        layer.scalars["ea_scaling"] = scaling
        scores = self.expected_scores(layer)
        if self.traits.prompt_only:  # nothing re-scores after the prompt: the statistics are freed
            for key in ("ea_turn", "ea_mean", "ea_scatter"):
                layer.aux.pop(key, None)
        return scores

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, None]:
        """Add this step's pre-RoPE query ``[batch, q_heads, 1, head_dim]`` to the running statistics
        (Welford; none held when prompt-only), then the seam's fused attention."""
        if self.traits.prompt_only:
            return super().decode_attention(layer, query, scaling)
        q = query.float()
        if layer.spec.rotary is not None:
            q = layer.spec.rotary.rerotate(q, 1 - layer.tokens_seen())
        q = q[:, :, 0]
        count = layer.scalars["ea_queries"]
        count += 1
        mean = layer.aux["ea_mean"]
        delta = q - mean
        mean += delta / count
        if self.use_covariance:
            layer.aux["ea_scatter"] += pack(delta[..., :, None] * (q - mean)[..., None, :])  # symmetric
        return super().decode_attention(layer, query, scaling)

    def step_scores(self, layer: CompressedLayer, probs: None) -> torch.Tensor:
        """Every slot re-scored with the statistics and the future window of this step."""
        return self.expected_scores(layer)

    def expected_scores(self, layer: CompressedLayer) -> torch.Tensor:
        """``(a_i + epsilon) ||v_i||`` ``[batch, kv_heads, slots]`` float32 of every slot from the
        statistics in ``layer.aux``, the future window starting after the newest token."""
        keys = layer.keys.float()
        rotary = layer.spec.rotary
        if rotary is not None:  # u_i = R_bar^T R(-t) k_i
            cos, sin = layer.aux["ea_turn"]
            keys = rotate(rotary.rerotate(keys, 1 - layer.tokens_seen()), cos, -sin)
        b, kv_heads, _, d = keys.shape
        s = layer.scalars["ea_scaling"]
        mean = layer.aux["ea_mean"].view(b, kv_heads, -1, d)
        logits = torch.einsum("bhsd,bhgd->bhgs", keys, mean) * s
        if self.use_covariance:
            cov = unpack(layer.aux["ea_scatter"] / layer.scalars["ea_queries"], d).view(b, kv_heads, -1, d, d)
            spread = torch.einsum("bhsd,bhgde->bhgse", keys, cov)
            logits = logits + (spread * keys[:, :, None]).sum(-1) * (s * s / 2)
        sink = layer.store.positions < self.n_sink
        probs = torch.softmax(logits.masked_fill(sink[:, :, None], float("-inf")), dim=-1)
        scores = probs.masked_fill(sink[:, :, None], 0.0).mean(dim=2)
        if self.use_vnorm:
            scores = (scores + self.epsilon) * layer.values.float().norm(dim=-1)
        best = scores.masked_fill(sink, 0.0).amax(dim=-1, keepdim=True)
        return torch.where(sink, best, scores)
