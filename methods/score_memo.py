"""Prompt scores computed once for the settings of a grid (``runners.generation.shared_prefill``).

The settings of a grid prefill each layer of one prompt from the same queries and keys, and several
of them score the prompt with the same function and arguments: H2O at three budgets computes the same
causal column sums three times (the scores do not depend on the budget). Within
:func:`shared_scores`, :func:`methods.scoring.causal_column_sums` returns a copy of an earlier
result when its inputs are equal (the same query tensor, equal keys and row weights, the same scale,
chunk and soft-cap), so each distinct computation runs once per layer; outside it nothing is kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_MEMO: ContextVar[list | None] = ContextVar("kvbench_score_memo", default=None)


@contextmanager
def shared_scores() -> Iterator[None]:
    """Within the block, equal score computations share one result (module docstring)."""
    token = _MEMO.set([])
    try:
        yield
    finally:
        _MEMO.reset(token)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def lookup(query: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None, args: tuple):
    """An earlier result for these inputs (a copy), or None (also outside :func:`shared_scores`)."""
    for q, k, w, a, out in _MEMO.get() or ():
        if q is query and a == args and _same(k, keys) and _same(w, weights):
            return out.clone()
    return None


def remember(
    query: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None, args: tuple, out: torch.Tensor
) -> None:
    """Keep ``out`` for later equal calls (copies of the keys, weights and result: callers may
    compress the layer's buffers in place); nothing outside :func:`shared_scores`."""
    memo = _MEMO.get()
    if memo is not None:
        memo.append((query, keys.clone(), None if weights is None else weights.clone(), args, out.clone()))
