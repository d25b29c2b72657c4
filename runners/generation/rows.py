"""Decode steps of several independent caches in one model forward (:class:`RowsCache`).

Row ``r`` of the batch belongs to cache ``rows[r]``: a :class:`~methods.seam.cache.CompressedCache`
of its own prompt, method and budget, prefilled on its own. The model's weights serve every row in
one forward (what batching buys: a decode step streams the weights once, whatever the batch); the
attention of each row runs on its own layer (``methods.seam.step.decode_step``), so a row's slots,
scores, positions and budget are exactly those of a batch-1 run, with no padding anywhere: nothing is
attended, scored, kept or counted that the row's own prompt did not hold. Rows may differ in prompt
length, position, budget and even method (a grid's settings of one prompt,
``runners.generation.shared_prefill``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from methods.seam.cache import CompressedCache
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.step import decode_step


class RowsLayer(CacheLayerMixin):
    """Layer ``layer_idx`` of every row's cache.

    Parameters
    ----------
    layers : list[CompressedLayer]
        The same decoder layer of each row's cache, in batch order; all prefilled.
    rules : list[CompressionMethod]
        Each row's rule for that layer.
    """

    def __init__(self, layers: list[CompressedLayer], rules: list[CompressionMethod]) -> None:
        self.rows, self.rules = layers, rules
        self.spec = layers[0].spec
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append row ``r``'s token ``[1, kv_heads, 1, head_dim]`` of ``key_states``/``value_states``
        ``[rows, kv_heads, 1, head_dim]`` to row ``r``'s layer; returns the inputs (the attention
        reads each row's layer).

        Raises
        ------
        ValueError
            If the batch is not one row per cache or a row gets more than one token.
        """
        if key_states.shape[0] != len(self.rows) or key_states.shape[2] != 1:
            raise ValueError(
                f"a RowsCache takes one token for each of its {len(self.rows)} rows per forward, got keys "
                f"of shape {tuple(key_states.shape)}"
            )
        for r, layer in enumerate(self.rows):
            layer.update(key_states[r : r + 1], value_states[r : r + 1])
        return key_states, value_states

    def decode(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """One decode step of every row on its own layer: ``query`` ``[rows, q_heads, 1, head_dim]``
        -> output ``[rows, q_heads, 1, head_dim]`` (each row exactly its batch-1 step)."""
        return torch.cat(
            [
                decode_step(rule, layer, query[r : r + 1], scaling)
                for r, (rule, layer) in enumerate(zip(self.rules, self.rows, strict=True))
            ],
            dim=0,
        )

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: every row's layer holds its own buffers."""

    def get_seq_length(self) -> int:
        """The longest row's tokens (rows carry their own positions: ``position_ids``)."""
        return max(layer.get_seq_length() for layer in self.rows)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Mask sizes for transformers' mask builders (the ``kvbench`` attention takes no mask)."""
        return max(layer.store.n_slots for layer in self.rows) + query_length, 0

    def get_max_length(self) -> int:
        """-1: no fixed maximum."""
        return -1


class RowsCache(Cache):
    """A ``transformers.Cache`` whose batch row ``r`` is the cache ``rows[r]`` (decode steps only).

    Parameters
    ----------
    rows : list[CompressedCache]
        Prefilled caches of one model, one per batch row, in order.

    Raises
    ------
    ValueError
        For no rows, caches of different layer counts, or a cache not yet prefilled.
    """

    def __init__(self, rows: list[CompressedCache]) -> None:
        if not rows or len({len(c.layers) for c in rows}) != 1:
            raise ValueError("a RowsCache needs at least one cache, all of the same model")
        if not all(layer.plan is not None for c in rows for layer in c.layers):
            raise ValueError("a RowsCache decodes prefilled caches only")
        super().__init__(
            layers=[
                RowsLayer([c.layers[i] for c in rows], [c.rules[i] for c in rows])
                for i in range(len(rows[0].layers))
            ]
        )
        self.rows = rows

    def attend(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """The attention function's call on layer ``layer_idx`` (``CompressedCache.attend``): one decode
        step of every row (:meth:`RowsLayer.decode`)."""
        return self.layers[layer_idx].decode(query, scaling)
