"""What a method is (:class:`Traits`), declared once per class (``CompressionMethod.TRAITS``) and
read by the seam, the storage kinds and the runners; its own module, which imports nothing of the
seam, so that neither the method contract nor a store needs the other to name it."""

from __future__ import annotations

from dataclasses import dataclass, field

#: What a decode step's attention can hand :meth:`CompressionMethod.decode_step`.
DECODE_INPUTS = ("none", "probs", "logits")


@dataclass(frozen=True)
class Traits:
    """What a method is, declared once per class (``CompressionMethod.TRAITS``); wrappers derive theirs
    from their scorer's (``methods.wrap``).

    Attributes
    ----------
    compresses : bool
        False for FullKV: no budget, nothing evicted.
    budget_applies : bool
        Whether the configured budget drives the method (False: the kept fraction is an outcome,
        KVMerger at a fixed ``theta``, DuoAttention); runners then record the budget as None.
    prompt_only : bool
        The budget holds for the prompt only: decoding appends, :meth:`CompressionMethod.decode_step`
        is not called, and decode attention hands it nothing.
    decode_rule : bool
        Whether the method has a decode-time rule (``decode_budget=true`` is refused otherwise).
    decode_input : str
        What decode attention hands :meth:`CompressionMethod.decode_step` (when not ``prompt_only``):
        ``"none"``; ``"probs"``, ``[batch, kv_heads, slots]`` float32 group-mean probabilities with the
        ``log_weight`` bias; ``"logits"``, ``[batch, kv_heads, group, slots]`` float32 scaled logits of
        every query head without the bias.
    score_decay : float | None
        ``lambda`` of a score update ``s <- lambda s + a`` that decode attention applies in place to
        the ``scores`` field (fused into the Triton kernel on CUDA); ``decode_step`` then receives
        ``probs=None``. Only with ``decode_input = "probs"``.
    uses_log_weight : bool
        Whether the method ever sets ``log_weight`` (merged or padded slots); if not, decode
        attention skips the bias.
    state_fill : dict[str, float]
        Per-slot state fields the method keeps, with the value new slots start with.
    counters : tuple[str, ...]
        Event counters the method keeps in ``layer.scalars`` (summed into the run record).
    ragged_heads : bool
        Whether the method gives heads their own slot counts (``layer.store.ragged``: AdaKV, DMS,
        DuoAttention, SimLayerKV, KVzip); every storage kind hands its codec on to ragged heads.
    merges : bool
        Whether the method merges slots (``MergingStorage``'s operations: ZSMerge, KVMerger, KeepKV).
    probes : bool
        Whether the method scores the prompt from forwards of its own after the prefill
        (``methods.probing.Probing``: KVzip); the runners feed its probes.
    """

    compresses: bool = True
    budget_applies: bool = True
    prompt_only: bool = False
    decode_rule: bool = True
    decode_input: str = "probs"
    score_decay: float | None = None
    uses_log_weight: bool = True
    state_fill: dict[str, float] = field(default_factory=dict)
    counters: tuple[str, ...] = ()
    ragged_heads: bool = False
    merges: bool = False
    probes: bool = False

    @property
    def holds_in_decode(self) -> bool:
        """Whether the configured budget also holds while decoding (it applies, and the method is not
        prompt-only)."""
        return self.compresses and self.budget_applies and not self.prompt_only

    @property
    def needs(self) -> str:
        """What decode attention must hand the method at a decode step (``"none"`` when prompt-only)."""
        return "none" if self.prompt_only or not self.compresses else self.decode_input


#: The traits of a method with no decode-time rule that never sets ``log_weight``: decode attention
#: hands it nothing and skips the bias (FullKV, DuoAttention, KVzip, SimLayerKV derive theirs).
NO_DECODE_RULE = Traits(decode_rule=False, decode_input="none", uses_log_weight=False)
