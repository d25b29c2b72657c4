"""The per-layer plan (:class:`LayerPlan`): a method's budget arithmetic for one layer and one sample,
done once, when the prompt arrives.

The seam asks the layer's rule for it (``CompressionMethod.plan``) right after the prompt is appended
and keeps it as ``layer.plan``; the layer sizes its buffers from ``plan.bound`` and the method reads
it at prefill and at every decode step, so decode steps do no budget arithmetic (static, host-free
steps) and nothing calls back into the method to size a buffer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerPlan:
    """What a method decided for one layer and one sample.

    Attributes
    ----------
    bound : int | None
        Slots per KV head the layer holds between decode steps; its buffers hold ``bound + 1``
        (the slot a decode step appends before evicting). None: decoding may grow the layer
        (FullKV, prompt-only methods).
    keep : int | None
        Slots the prompt is compressed to at prefill: ``bound``, or the budget for a prompt-only
        method (SnapKV, KVMerger). None: the prompt is kept whole.
    first, recent : int
        Protected tokens under ``keep``: the first ``first`` tokens (attention sinks) and the
        ``recent`` most recent ones (recent / observation window).
    split : tuple[int, ...]
        The method's own division of ``bound`` (ZSMerge: ``(B_p, B_c, B_r)`` of Eq. 3); empty if
        it has none.
    """

    bound: int | None = None
    keep: int | None = None
    first: int = 0
    recent: int = 0
    split: tuple[int, ...] = ()

    def fits(self, slots: int) -> bool:
        """Whether a prompt of ``slots`` tokens per KV head needs no compression at prefill: nothing
        to keep (``keep`` None) or no more than ``keep`` slots."""
        return self.keep is None or slots <= self.keep


class Slots(int):
    """A slot budget floored from a share of the prompt (``runners.setup.budget.resolve_budget``): an
    ``int`` (the slots) that keeps the ``share`` it came from, so a rule defined on the share itself
    (kvpress's PyramidKV budget, ChunkKV's chunk count) computes exactly what its reference does.
    Arithmetic gives plain ints; a bare int budget has no share (rules then use ``slots / prompt``).
    ``CompressedLayer`` keeps the share apart and the budget as a plain int (compiled steps trace
    plain ints only).

    Attributes
    ----------
    share : float | None
        The fraction of the prompt's tokens the budget was floored from, in (0, 1]; None for an
        absolute budget that carries a ``question``.
    question : int | None
        The question's tokens at the end of the compressed prompt (a query-aware run of a task with
        a question: ``runners.quality.check_budgets``), else None; FINCH's window
        (``CompressedLayer.question``).
    """

    share: float | None
    question: int | None

    def __new__(cls, slots: int, share: float | None, question: int | None = None) -> Slots:
        out = super().__new__(cls, slots)
        out.share, out.question = share, question
        return out

    def __getnewargs__(self) -> tuple[int, float | None, int | None]:
        return int(self), self.share, self.question


def budget_share(share: float | None, budget: int, prompt: int) -> float:
    """The share of a ``prompt``-token prompt that ``budget`` slots stand for: ``share``, the one a
    :class:`Slots` budget was floored from (``CompressedLayer.share``), else ``budget / prompt``."""
    return budget / prompt if share is None else share
