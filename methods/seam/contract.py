"""The method contract: a small dataclass that declares its traits once and states its rules; the seam
does the rest.

A method never touches the model. Per layer and sample the seam asks :meth:`CompressionMethod.plan`
once when the prompt arrives (the layer's :class:`~methods.seam.plan.LayerPlan`), calls
:meth:`CompressionMethod.prefill` after the prompt's attention, and per decode step
:meth:`CompressionMethod.decode_attention` (the layer's store attends, as the traits say) then
:meth:`CompressionMethod.decode_step`. What the seam does for a method follows from its
:class:`Traits`. docs/extending.md lists every name a method may use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import torch

from methods.seam.plan import LayerPlan
from methods.seam.traits import Traits

if TYPE_CHECKING:
    from methods.seam.layer import CompressedLayer
    from methods.seam.storage import SlotStorage


@dataclass(frozen=True)
class AssetRequest:
    """Which assets a run needs of its method (:meth:`CompressionMethod.attach_assets`).

    Attributes
    ----------
    checkpoints_dir : str
        Where trained assets live (``paths.checkpoints_dir``).
    model : str
        The run's model name.
    budget : float | int | None
        The run's budget, in ``budget_unit``.
    budget_unit : str
        ``prompt`` or ``context`` (``runners.setup.budget``).
    """

    checkpoints_dir: str
    model: str
    budget: float | int | None
    budget_unit: str


@dataclass
class CompressionMethod:
    """Base class of every KV-cache method.

    Class attributes
    ----------------
    name : str
        Registry key (``method=<name>`` on the command line).
    TRAITS : Traits
        What the method is (:class:`Traits`), with the paper's rule for decoding.

    Parameters
    ----------
    decode_budget : bool | None
        The one switch of every method between its paper's decode-time rule (None, default), holding
        the budget while decoding (true: evict after each step; refused for a method without a
        decode-time rule) and compressing the prompt only (false: kvpress's presses).

    Raises
    ------
    ValueError
        From :meth:`check_model` (at build) for a ``decode_budget`` that is not a boolean, or true for
        a method without a decode-time rule.
    """

    name: ClassVar[str] = "base"
    TRAITS: ClassVar[Traits] = Traits()

    decode_budget: bool | None = field(default=None, kw_only=True)

    @cached_property
    def traits(self) -> Traits:
        """The declared :class:`Traits` with ``decode_budget`` applied (computed once)."""
        return self.with_decode_budget(self.TRAITS)

    def with_decode_budget(self, traits: Traits) -> Traits:
        """``traits`` with this instance's ``decode_budget`` applied (prompt-only or not)."""
        if self.decode_budget is None or not traits.compresses:
            return traits
        return replace(traits, prompt_only=not self.decode_budget)

    def paper(self) -> CompressionMethod:
        """The same method under its paper's decoding rule (``decode_budget`` unset)."""
        return replace(self, decode_budget=None)

    @property
    def label(self) -> str:
        """The method's name in records and reports: ``name`` for a method that stands alone; a
        wrapper names what it wraps (an allocator over a scorer: ``adakv_snapkv``)."""
        return self.name

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The layer's :class:`~methods.seam.plan.LayerPlan` for this sample: asked once by the seam,
        when the prompt has been appended (``layer.keys`` holds it), and kept as ``layer.plan``.

        The one owner of the per-layer budget: the layer sizes its buffers from ``plan.bound`` and
        the method compresses to it. Default: bound = keep = ``layer.budget`` (no bound when the
        method is prompt-only). Methods whose per-layer numbers differ (KeepKV's cosine layer budgets,
        H2O Baseline+'s extra slots, ZSMerge's split) override it.
        """
        budget = layer.budget if self.traits.compresses else None
        return LayerPlan(bound=None if self.traits.prompt_only else budget, keep=budget)

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

    def attach_assets(self, request: AssetRequest) -> None:
        """Load what the method needs besides the model (LESS: its trained kernels) for ``request``;
        no-op by default.

        Raises
        ------
        FileNotFoundError
            With a one-line message saying how to produce the missing asset.
        """

    def check_model(self, config) -> None:
        """Check the method's options and that it fits the model before it loads (``config``: the
        model's text config, ``num_hidden_layers``, ``num_key_value_heads``, ...): ``decode_budget``
        here; DuoAttention checks its head pattern's shape.

        Raises
        ------
        ValueError
            With the method's reason.
        """
        if self.decode_budget is not None and not isinstance(self.decode_budget, bool):
            raise ValueError(f"decode_budget must be true or false, got {self.decode_budget!r}")
        if self.decode_budget and self.traits.compresses and not self.traits.decode_rule:
            raise ValueError(f"{self.label} has no decode-time rule: decode_budget=true is not available")

    def check_storage(self, store: SlotStorage) -> None:
        """Check that the run's storage kind (``quant=``; ``store``: an empty store of it) can hold
        what the method writes, before the model loads. Default: any.

        Raises
        ------
        ValueError
            With the method's reason (ThinK: a store that cannot hold keys of fewer channels).
        """

    def prepare_graph_step(self, layer: CompressedLayer, k: int) -> None:
        """Before a compiled decode step of ``k`` tokens, eagerly: create the ``layer.aux`` state the
        step would otherwise create inside the captured graph, where the next CUDA graph replay would
        overwrite it (``CompressedCache.prepare_graph_step``). Default: nothing; StreamingLLM keeps its
        sinks' original keys here at the first eviction."""

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of one decode step over the layer's slots. Default: the layer's store attends
        (``SlotStorage.attend``, chosen from the traits). Override to change attention or to observe
        the query: LESS adds its low-rank term, StreamingLLM re-rotates its attention sinks and then
        calls this, Expected Attention keeps query statistics first.

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
            Output ``[batch, q_heads, 1, head_dim]`` and what :meth:`decode_step` receives
            (``Traits.decode_input``; None when the score update was fused).
        """
        return layer.store.attend(query, scaling, self.traits, layer.spec.softcap)

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
        """Update scores from one decode step and evict/merge back down to the budget (not called
        for a prompt-only method).

        Parameters
        ----------
        layer : CompressedLayer
            Holds the slots including the token appended this step (last slot).
        probs : torch.Tensor | None
            What :meth:`decode_attention` returned (``Traits.decode_input``).
        """
