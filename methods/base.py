"""The method contract: a small dataclass that states its rules; the seam does the rest.

A method never touches the model. The attention function (``methods.attention``) calls
:meth:`CompressionMethod.prefill` once per layer after the prompt's attention, and
:meth:`CompressionMethod.decode_step` once per layer after each decode step's attention, passing
that step's attention probabilities aggregated per KV head (group mean, docs/design.md "GQA/MQA").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from kernels import decode_attention
from methods.layer import CompressedLayer


@dataclass
class CompressionMethod:
    """Base class of every KV-cache method.

    Class attributes
    ----------------
    name : str
        Registry key (``method=<name>`` on the command line).
    compresses : bool
        False for FullKV: the budget is ignored and recorded as None.
    decode_input : str
        What :meth:`decode_step` receives from each decode step's attention: ``"none"``,
        ``"probs"`` (group-mean probabilities) or ``"logits"`` (scaled logits of every query
        head, without the ``log_weight`` bias). With ``"none"`` and no bias the seam uses fused
        SDPA for decode attention.
    state_fill : dict[str, float]
        Per-slot state tensors the method keeps, with the value new slots start with.
    uses_log_weight : bool
        Whether the method ever sets ``log_weight`` (merged or padded slots); if not, decode
        attention skips the bias.
    counters : tuple[str, ...]
        Names of integer event counters the method keeps in ``layer.meta`` (summed over layers
        and samples into the run record).
    """

    name: ClassVar[str] = "base"
    compresses: ClassVar[bool] = True
    decode_input: ClassVar[str] = "probs"
    state_fill: ClassVar[dict[str, float]] = {}
    uses_log_weight: ClassVar[bool] = True
    counters: ClassVar[tuple[str, ...]] = ()

    @property
    def budget_applies(self) -> bool:
        """Whether the configured budget drives this method (False: FullKV, or KVMerger with a fixed
        ``theta``, whose kept ratio is an outcome); runners record the budget as None otherwise."""
        return self.compresses

    @property
    def budget_holds_in_decode(self) -> bool:
        """Whether decoding also stays within the budget (False: only the prompt is compressed)."""
        return self.compresses

    def slot_bound(self, layer: CompressedLayer) -> int | None:
        """Slots per KV head this method holds on ``layer`` between decode steps, or None when
        decoding may grow the layer without bound (FullKV, prompt-only methods).

        The one owner of the per-layer budget: the layer sizes its buffers from it (plus the slot a
        decode step appends before evicting) and the method evicts down to it. Methods whose
        per-layer bound differs from ``layer.budget`` (KeepKV's cosine layer budgets, H2O
        Baseline+'s extra slots) override it.
        """
        if layer.budget is None or not self.budget_holds_in_decode:
            return None
        return layer.budget

    def check_budget(self, budget: int, tokens: int) -> None:
        """Check that ``budget`` slots work for a sample of ``tokens`` tokens (prompt + new) before
        any model loads: a method that splits its budget (a ``split(budget)`` method: H2O's heavy
        and recent shares, ZSMerge's Eq. 3) must be able to split it once compression starts.

        Raises
        ------
        ValueError
            With the method's reason (e.g. a ZSMerge split with no context slot).
        """
        split = getattr(self, "split", None)
        if split is not None and tokens > budget:
            split(budget)

    def attach_assets(
        self, checkpoints_dir: str, model: str, budget: float | int | None, budget_unit: str
    ) -> None:
        """Load what the method needs besides the model (LESS: its trained kernels); no-op by default.

        Raises
        ------
        FileNotFoundError
            With a one-line message saying how to produce the missing asset.
        """

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, values: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of one decode step over the layer's slots (LESS adds its low-rank term here,
        StreamingLLM re-rotates its attention sinks).

        Parameters
        ----------
        layer : CompressedLayer
            The layer, this step's token already appended.
        query : torch.Tensor
            ``[batch, q_heads, 1, head_dim]`` post-RoPE.
        values : torch.Tensor
            ``[batch, kv_heads, slots, head_dim]``.
        scaling : float
            Softmax scale.

        Returns
        -------
        tuple[torch.Tensor, torch.Tensor | None]
            Output ``[batch, q_heads, 1, head_dim]`` and what :meth:`decode_step` receives
            (see ``decode_input``; None for ``"none"``).
        """
        keys = layer.keys
        if self.decode_input == "none" and not self.uses_log_weight and layer.softcap is None:
            out = F.scaled_dot_product_attention(query, keys, values, scale=scaling, enable_gqa=True)
            return out, None
        logits = self.decode_input == "logits"
        bias = layer.log_weight if self.uses_log_weight else None
        decay = self.score_decay(layer) if self.decode_input == "probs" else None
        fused = None if decay is None else layer.store.view("scores")  # updated in place by the kernel
        out, scores = decode_attention(
            query,
            keys,
            values,
            bias,
            scaling,
            return_logits=logits,
            scores=fused,
            decay=1.0 if decay is None else decay,
            softcap=layer.softcap,
        )
        return out, None if self.decode_input == "none" or fused is not None else scores

    def score_decay(self, layer: CompressedLayer) -> float | None:
        """``lambda`` of a score update ``s <- lambda * s + a`` (``a``: this step's group-mean
        probabilities ``[batch, kv_heads, slots]``) that the decode attention applies in place to the
        ``scores`` field (fused into the Triton kernel on CUDA, ``kernels.triton_decode``); the method's
        :meth:`decode_step` then receives None instead of the probabilities. None (default): the
        method gets the probabilities and updates its scores itself."""
        return None

    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Initialise state from the prompt and compress the layer to its budget.

        Parameters
        ----------
        layer : CompressedLayer
            Holds the whole prompt: ``keys``/``values`` ``[batch, kv_heads, prompt, head_dim]``.
        query : torch.Tensor
            Post-RoPE prompt queries ``[batch, q_heads, prompt, head_dim]``.
        scaling : float
            Softmax scale (``head_dim ** -0.5`` for Llama).
        """

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Update scores from one decode step and evict/merge back down to the budget.

        Parameters
        ----------
        layer : CompressedLayer
            Holds the slots including the token appended this step (last slot).
        probs : torch.Tensor | None
            ``[batch, kv_heads, slots]`` float32 attention probabilities of this step (with the
            ``log_weight`` bias), mean over the query heads of each group; with
            ``decode_input = "logits"`` instead ``[batch, kv_heads, group, slots]`` float32 scaled
            logits ``q k^T * scaling`` without the bias; None for ``decode_input = "none"``.
        """
