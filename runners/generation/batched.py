"""Batched greedy generation (``runner.batch_size``): each prompt is prefilled on its own into its own
compressed cache, then the decode steps of up to ``batch_size`` prompts run in one model forward
(:class:`~runners.generation.rows.RowsCache`), continuously: a row that ends (EOS, stop token, max tokens)
leaves the batch at once, and the next prompt's prefill takes its place.

A row's tokens are those of its batch-1 run (:func:`runners.generation.greedy.greedy_generate`): its
attention, scores, evictions and positions are computed on its own cache, exactly as at batch 1; only the
model's linear layers see several rows at once. Its budget is a fraction of its own prompt; nothing
is padded, so no pad token is ever attended, scored, kept or counted. Each row's ``step_seconds``
are the wall times of the batched steps it took part in (the latency of its tokens); throughput is
samples (or tokens) over the whole loop's wall time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.generation.greedy import (
    GenerationResult,
    Row,
    begin_generation,
    end_generation,
    prefill_prompt,
    step_rows,
)


def start_row(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    method,
    budget: int | None,
    max_new_tokens: int,
    eos_token_ids: set[int],
    min_new_tokens: int = 0,
    question_start: int | None = None,
    storage: StorageKind = SlotStore,
) -> Row:
    """Prefill one prompt ``[1, prompt]`` on its own cache (the context only, then the question chunk,
    when ``question_start`` is given) and pick its first token; arguments as
    :func:`runners.generation.greedy.greedy_generate`; ``storage``: the run's storage kind.

    Raises
    ------
    ValueError
        As :func:`runners.generation.greedy.prefill_prompt`.
    """
    run, logits, seconds = prefill_prompt(
        model, input_ids, method, budget, max_new_tokens, question_start, storage=storage
    )
    return begin_generation(
        run, input_ids, logits, budget, max_new_tokens, eos_token_ids, seconds, min_new_tokens
    )


@torch.inference_mode()
def decode_rows(
    rows: Iterable[tuple[object, Callable[[], Row]]], batch_size: int
) -> Iterator[tuple[object, GenerationResult]]:
    """Greedy decode steps of many rows, up to ``batch_size`` per model forward.

    Parameters
    ----------
    rows : Iterable[tuple[object, Callable[[], Row]]]
        ``(key, start)`` per prompt, in order: ``start()`` prefills it (:func:`start_row`) when a
        place in the batch is free, so at most ``batch_size`` caches exist at once.
    batch_size : int
        Rows per decode forward (>= 1).

    Yields
    ------
    tuple[object, GenerationResult]
        ``(key, result)`` of each row as it ends (not necessarily in input order).

    Raises
    ------
    ValueError
        If ``batch_size`` < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pending = iter(rows)
    active: list[tuple[object, Row]] = []
    exhausted = False
    while True:
        while not exhausted and len(active) < batch_size:
            nxt = next(pending, None)
            if nxt is None:
                exhausted = True
                break
            key, row = nxt[0], nxt[1]()
            if row.done():
                yield key, end_generation(row.run, row.result)
            else:
                active.append((key, row))
        if not active:
            return
        step_rows([row for _, row in active])
        still = []
        for key, row in active:
            if row.done():
                yield key, end_generation(row.run, row.result)
            else:
                still.append((key, row))
        active = still
