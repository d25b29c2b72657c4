"""CAPKV (arXiv 2604.25975; kvpress's ``CapPress``): keep the tokens of the largest query-weighted
leverage of their values.

Per query head, a historical-query anchor ``mu``: the mean of the prompt's pre-RoPE queries after the
``n_sink`` sinks, turned by the RoPE rotation averaged over the next ``n_future_positions`` positions
``prompt .. prompt + T - 1``. Each token after the sinks gets a relevance weight
``w_i = exp(tau (cos(mu, k_i) - max_j cos(mu, k_j)))`` (keys and anchor L2-normalised, post-RoPE keys)
and the score ``s_i = w_i v_i^T A^{-1} v_i`` with ``A = I + sum_j (w_j + epsilon) v_j v_j^T``
(a ``head_dim x head_dim`` solve in float32), averaged over the query heads of each KV group. As
``cap_press.py`` (its notes 1-4: normalised alignment, max shift, the averaged future RoPE, ``u_i = v_i``);
the sinks are kept. Prompt only (kvpress: a prefill scorer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from methods.checks import check_bounds, option
from methods.evict import ScoreEvict
from methods.scoring import group_queries
from methods.seam.contract import Traits
from methods.seam.layer import CompressedLayer
from methods.seam.rope import rotate


@dataclass
class Cap(ScoreEvict):
    """CAPKV: per KV head, keep the sinks and the top ``w_i v_i^T A^{-1} v_i`` (module docstring).

    Parameters
    ----------
    tau : float
        Temperature of the relevance weights (kvpress: 5).
    n_future_positions : int
        Positions after the prompt the anchor's RoPE rotation is averaged over (kvpress: 512).
    n_sink : int
        First tokens kept and left out of the anchor and the capacity matrix (kvpress: 4).
    epsilon : float
        Added to the weights in ``A`` (kvpress: 1e-6).

    Raises
    ------
    ValueError
        For ``tau`` or ``epsilon`` < 0, ``n_future_positions`` < 1 or ``n_sink`` < 0.
    """

    name: ClassVar[str] = "cap"
    TRAITS: ClassVar[Traits] = replace(
        ScoreEvict.TRAITS, prompt_only=True, decode_rule=False, decode_input="none"
    )

    tau: float = option(5.0, low=0)
    n_future_positions: int = option(512, low=1)
    n_sink: int = option(4, low=0, high="max_context")
    epsilon: float = option(1e-6, low=0)

    def __post_init__(self) -> None:
        check_bounds(self)

    def protected(self, bound: int) -> tuple[int, int]:
        """The ``n_sink`` first tokens, under ``bound``."""
        return min(self.n_sink, bound), 0

    def anchor(self, layer: CompressedLayer, query: torch.Tensor) -> torch.Tensor:
        """The historical-query anchor ``[batch, q_heads, head_dim]`` float32 from the post-RoPE prompt
        queries ``[batch, q_heads, prompt, head_dim]``: turned back to pre-RoPE, averaged after the
        sinks, turned by the mean rotation over positions ``prompt .. prompt + n_future_positions - 1``
        (linear: the mean of the turned queries)."""
        q = query.float()
        n = q.shape[2]
        rotary = layer.spec.rotary
        if rotary is None:
            return q[:, :, self.n_sink :].mean(dim=2)
        cos, sin = rotary.table(torch.arange(n, device=q.device), torch.float32)
        mean = rotate(q, cos, -sin)[:, :, self.n_sink :].mean(dim=2)
        cos, sin = rotary.table(torch.arange(n, n + self.n_future_positions, device=q.device), torch.float32)
        return rotate(mean, cos.mean(0), sin.mean(0))

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """``w_i v_i^T A^{-1} v_i`` ``[batch, kv_heads, prompt]`` of the tokens after the sinks; the sinks
        score one above the best of them (kvpress's padding)."""
        keys, values = layer.keys.float(), layer.values.float()
        b, h, n, d = keys.shape
        scores = torch.zeros(b, h, n, device=keys.device)
        if n <= self.n_sink:  # nothing to rank (kvpress raises)
            return scores
        keys, values = keys[:, :, self.n_sink :], values[:, :, self.n_sink :]
        mu = F.normalize(group_queries(self.anchor(layer, query)[:, :, None], h)[:, :, :, 0], dim=-1)
        align = torch.einsum("bhgd,bhtd->bhgt", mu, F.normalize(keys, dim=-1)).clamp(-1.0, 1.0)
        logits = self.tau * align
        weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))  # [b, h, g, t]
        eye = torch.eye(d, device=keys.device)
        capacity = eye + torch.einsum("bhgt,bhtd,bhte->bhgde", weights + self.epsilon, values, values)
        vt = values.transpose(-1, -2)[:, :, None].expand(-1, -1, weights.shape[2], -1, -1)  # [b, h, g, d, t]
        leverage = (vt * torch.linalg.solve(capacity, vt)).sum(dim=-2)
        mid = (weights * leverage).mean(dim=2)
        scores[:, :, self.n_sink :] = mid
        scores[:, :, : self.n_sink] = mid.flatten(1).amax(1)[:, None, None] + 1
        return scores
