"""The method contract: a small dataclass that states its rules; the seam does the rest.

A method never touches the model. Per layer and sample the seam calls :meth:`CompressionMethod.plan`
once when the prompt arrives (the layer's :class:`~methods.seam.plan.LayerPlan`),
:meth:`CompressionMethod.prefill` after the prompt's attention, and per decode step
:meth:`CompressionMethod.decode_attention` (the seam's dispatch unless overridden) then
:meth:`CompressionMethod.decode_step` with what the method declared it needs (``decode_input``:
probabilities aggregated per KV head, group mean, docs/design.md "GQA/MQA"; logits; nothing).
docs/extending.md lists every name a method may use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from methods.seam import dispatch
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan


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
        SDPA for decode attention (``methods.seam.dispatch``).
    state_fill : dict[str, float]
        Per-slot state tensors the method keeps, with the value new slots start with.
    score_decay : float | None
        ``lambda`` of a score update ``s <- lambda * s + a`` (``a``: this step's group-mean
        probabilities ``[batch, kv_heads, slots]``) that the seam's decode attention applies in
        place to the ``scores`` field (fused into the Triton kernel on CUDA); :meth:`decode_step`
        then receives ``probs=None``. None (default): the method gets the probabilities and
        updates its scores itself. Only with ``decode_input = "probs"``.
    uses_log_weight : bool
        Whether the method ever sets ``log_weight`` (merged or padded slots); if not, decode
        attention skips the bias.
    counters : tuple[str, ...]
        Names of event counters the method keeps in ``layer.scalars`` (numbers or tensors of any
        shape, e.g. per head; summed over their elements, layers and samples into the run record).
    """

    name: ClassVar[str] = "base"
    compresses: ClassVar[bool] = True
    decode_input: ClassVar[str] = "probs"
    score_decay: ClassVar[float | None] = None
    state_fill: ClassVar[dict[str, float]] = {}
    uses_log_weight: ClassVar[bool] = True
    counters: ClassVar[tuple[str, ...]] = ()

    @property
    def label(self) -> str:
        """The method's name in records and reports: ``name`` for a method that stands alone; a
        wrapper names what it wraps (an allocator over a scorer: ``adakv_snapkv``)."""
        return self.name

    @property
    def budget_applies(self) -> bool:
        """Whether the configured budget drives this method (False: FullKV, or KVMerger with a fixed
        ``theta``, whose kept ratio is an outcome); runners record the budget as None otherwise."""
        return self.compresses

    @property
    def budget_holds_in_decode(self) -> bool:
        """Whether decoding also stays within the budget (False: only the prompt is compressed)."""
        return self.compresses

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The layer's :class:`~methods.seam.plan.LayerPlan` for this sample: called once by the seam,
        when the prompt has been appended (``layer.keys`` holds it), and kept as ``layer.plan``.

        The one owner of the per-layer budget: the layer sizes its buffers from ``plan.bound`` and
        the method compresses to it. Default: bound = keep = ``layer.budget`` (no bound for a
        method whose budget does not hold in decode). Methods whose per-layer numbers differ
        (KeepKV's cosine layer budgets, H2O Baseline+'s extra slots, ZSMerge's split) override it.
        """
        budget = layer.budget if self.compresses else None
        return LayerPlan(bound=budget if self.budget_holds_in_decode else None, keep=budget)

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

    def check_model(self, config) -> None:
        """Check that the method fits the model before it loads (``config``: the model's text config,
        ``num_hidden_layers``, ``num_key_value_heads``, ...); no-op by default (DuoAttention checks
        its head pattern's shape).

        Raises
        ------
        ValueError
            With the method's reason.
        """

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of one decode step over the layer's slots. Default: the seam's
        (:func:`methods.seam.dispatch.decode_attention`, chosen from ``decode_input``,
        ``uses_log_weight`` and ``score_decay``). Override only to change attention itself: LESS
        adds its low-rank term, StreamingLLM re-rotates its attention sinks and then calls this.

        Parameters
        ----------
        layer : CompressedLayer
            The layer, this step's token already appended.
        query : torch.Tensor
            ``[batch, q_heads, 1, head_dim]`` post-RoPE.
        scaling : float
            Softmax scale.

        Returns
        -------
        tuple[torch.Tensor, torch.Tensor | None]
            Output ``[batch, q_heads, 1, head_dim]`` and what :meth:`decode_step` receives.
        """
        return dispatch.decode_attention(layer, query, scaling)

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
            logits ``q k^T * scaling`` without the bias; None for ``decode_input = "none"``, and
            when the seam fused the score update (:attr:`score_decay`).
        """
