"""A scorer's selection on a subset of a layer's prompt slots (:func:`subset_keep`): what kvpress's
``BlockPress`` and ``ChunkPress`` do when they call their press's ``score`` on some of the tokens only
(a block plus the tokens kept so far; one chunk).

The scorer sees a :class:`SubsetLayer`: the chosen slots' keys, values, positions and state, and the
queries of those tokens, in the order given (position order), under a plan of its own for the
subset (``keep`` and the scorer's protected tokens under it). Everything else (the layer's spec,
scalars, ...) is the layer's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from methods.scoring import keep_index
from methods.seam.plan import LayerPlan
from methods.seam.slots import gather_slots

if TYPE_CHECKING:
    from methods.evict import ScoreEvict
    from methods.seam.layer import CompressedLayer


class SubsetStore:
    """The store's views on the slots ``index`` ``[batch, kv_heads, m]``; other attributes are the
    layer's store's (read only: the subset is never written)."""

    def __init__(self, store, index: torch.Tensor) -> None:
        self._store = store
        self.keys = gather_slots(store.keys, index)
        self.values = gather_slots(store.values, index)
        self.positions = gather_slots(store.positions, index)
        self.log_weight = gather_slots(store.log_weight, index)
        self.state = {name: gather_slots(t, index) for name, t in store.state.items()}
        self.n_slots = index.shape[-1]

    def head_slots(self) -> torch.Tensor:
        """``[batch, kv_heads]``: every head holds the whole subset."""
        return torch.full(self.positions.shape[:2], self.n_slots, device=self.positions.device)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


class SubsetLayer:
    """A layer as a scorer sees it when it scores the slots ``index`` ``[batch, kv_heads, m]`` only
    (module docstring): ``keys``, ``values`` ``[batch, kv_heads, m, head_dim]``, ``store``
    (:class:`SubsetStore`), ``plan`` (``keep`` and the scorer's protected tokens under it), ``budget``
    (``keep``); the rest is ``layer``'s."""

    def __init__(self, layer: CompressedLayer, index: torch.Tensor, keep: int, scorer: ScoreEvict) -> None:
        self._layer = layer
        self.store = SubsetStore(layer.store, index)
        self.keys, self.values = self.store.keys, self.store.values
        self.budget, self.share = keep, None
        first, recent = scorer.protected(keep)
        self.plan = LayerPlan(keep=keep, first=first, recent=recent)

    def __getattr__(self, name: str):
        return getattr(self._layer, name)


def subset_query(query: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The prompt queries ``[batch, q_heads, prompt, head_dim]`` of the tokens ``index`` ``[batch,
    kv_heads, m]`` (prompt slots = positions), each KV head's for its query heads: ``[batch, q_heads, m,
    head_dim]``."""
    b, qh, _, d = query.shape
    h, m = index.shape[1], index.shape[2]
    grouped = query.view(b, h, qh // h, -1, d)
    picked = grouped.gather(3, index[:, :, None, :, None].expand(b, h, qh // h, m, d))
    return picked.reshape(b, qh, m, d)


def subset_keep(
    scorer: ScoreEvict,
    layer: CompressedLayer,
    query: torch.Tensor,
    scaling: float,
    index: torch.Tensor,
    keep: int,
) -> torch.Tensor:
    """The slots ``[batch, kv_heads, keep]`` (ascending when ``index`` is) that ``scorer`` keeps of the
    prompt slots ``index`` ``[batch, kv_heads, m]`` (ascending) when it scores them alone: its protected
    tokens of the subset and the top ``keep - protected`` of its scores over the subset (by position,
    newest kept, for a scorer without scores). ``query`` ``[batch, q_heads, prompt, head_dim]``
    post-RoPE. ``index`` itself when ``keep >= m``."""
    if keep >= index.shape[-1]:
        return index
    view = SubsetLayer(layer, index, keep, scorer)
    scores = scorer.prefill_scores(view, subset_query(query, index), scaling)
    if scores is None:
        scores = view.store.positions
    plan = view.plan
    chosen = keep_index(scores, plan.first, keep - plan.first - plan.recent, plan.recent)
    return index.gather(-1, chosen)
