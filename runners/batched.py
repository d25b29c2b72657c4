"""Batched greedy generation (``runner.batch_size``): each prompt is prefilled on its own into its own
compressed cache, then the decode steps of up to ``batch_size`` prompts run in one model forward
(:class:`~methods.seam.rows.RowsCache`), continuously: a row that ends (EOS, stop token, max tokens)
leaves the batch at once, and the next prompt's prefill takes its place.

A row's tokens are those of its batch-1 run (:func:`runners.generate.greedy_generate`): its attention,
scores, evictions and positions are computed on its own cache, exactly as at batch 1; only the
model's linear layers see several rows at once. Its budget is a fraction of its own prompt; nothing
is padded, so no pad token is ever attended, scored, kept or counted. Each row's ``step_seconds``
are the wall times of the batched steps it took part in (the latency of its tokens); throughput is
samples (or tokens) over the whole loop's wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from methods.seam.rows import RowsCache
from runners.generate import (
    GenerationResult,
    ModelRun,
    add_token,
    begin_generation,
    end_generation,
    generation_done,
    prefill_prompt,
)


@dataclass
class Row:
    """One prompt being generated: its run (prefilled cache), its result so far and its limits."""

    run: ModelRun
    result: GenerationResult
    max_new_tokens: int
    eos_token_ids: set[int]
    min_new_tokens: int = 0

    def done(self) -> bool:
        """Whether the row's generation has ended."""
        return generation_done(self.result, self.eos_token_ids, self.max_new_tokens)


def start_row(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    method,
    budget: int | None,
    max_new_tokens: int,
    eos_token_ids: set[int],
    min_new_tokens: int = 0,
    question_start: int | None = None,
) -> Row:
    """Prefill one prompt ``[1, prompt]`` on its own cache (the context only, then the question chunk,
    when ``question_start`` is given) and pick its first token; arguments as
    :func:`runners.generate.greedy_generate`.

    Raises
    ------
    ValueError
        As :func:`runners.generate.prefill_prompt`.
    """
    run, logits, seconds = prefill_prompt(model, input_ids, method, budget, max_new_tokens, question_start)
    result = begin_generation(run, input_ids, logits, budget, eos_token_ids, seconds, min_new_tokens)
    return Row(run, result, max_new_tokens, eos_token_ids, min_new_tokens)


@torch.inference_mode()
def decode_rows(
    model: torch.nn.Module, rows: Iterable[tuple[object, Callable[[], Row]]], batch_size: int
) -> Iterator[tuple[object, GenerationResult]]:
    """Greedy decode steps of many rows, up to ``batch_size`` per model forward.

    Parameters
    ----------
    model : torch.nn.Module
        A causal LM loaded with ``attn_implementation="kvbench"``.
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
        _step([row for _, row in active], model)
        still = []
        for key, row in active:
            if row.done():
                yield key, end_generation(row.run, row.result)
            else:
                still.append((key, row))
        active = still


def _step(rows: list[Row], model: torch.nn.Module) -> None:
    """One decode forward of every row: its last token at its own position, on its own cache (a
    single row: its own run's step, eager or compiled, as :func:`runners.generate.greedy_generate`)."""
    device = rows[0].run.cache.layers[0].device
    tokens = torch.tensor([row.result.tokens[-1] for row in rows], device=device)
    start = time.perf_counter()
    if len(rows) == 1:
        logits = rows[0].run.step(tokens)
    else:
        positions = torch.tensor([[row.run.seen] for row in rows], device=device)
        cache = RowsCache([row.run.cache for row in rows])
        logits = model(
            input_ids=tokens[:, None], position_ids=positions, past_key_values=cache, use_cache=True,
            kvbench_cache=cache,
        ).logits[:, -1]  # fmt: skip
        for row in rows:
            row.run.seen += 1
    seconds = time.perf_counter() - start
    for row, row_logits in zip(rows, logits, strict=True):
        add_token(row.result, row_logits, row.eos_token_ids, row.min_new_tokens, seconds)
