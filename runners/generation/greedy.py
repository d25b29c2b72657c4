"""Our own greedy loop: prefill, then one token per decode step, with the compressed cache
(the model calls: ``runners.generation.model_run``). A prompt being generated is a :class:`Row`; one decode
step of one row or of several (:func:`step_rows`) is the step of :func:`greedy_generate` and of the
batched loop (``runners.generation.batched``), so batch 1 and batch N share one decode loop body.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from methods.seam.contract import CompressionMethod
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.generation.model_run import ModelRun, forward_rows
from runners.generation.result import GenerationResult

__all__ = [
    "GenerationResult",
    "ModelRun",
    "Row",
    "add_token",
    "begin_generation",
    "end_generation",
    "eos_token_ids",
    "finish_generation",
    "generation_done",
    "greedy_generate",
    "prefill_prompt",
    "step_rows",
]


def eos_token_ids(model: torch.nn.Module, tokenizer=None) -> set[int]:
    """Token ids that end generation: the generation config's EOS id(s) and the tokenizer's."""
    config_eos = getattr(model.generation_config, "eos_token_id", None)
    ids = set(config_eos) if isinstance(config_eos, list) else {config_eos}
    if tokenizer is not None:
        ids.add(tokenizer.eos_token_id)
    return {int(i) for i in ids if i is not None}


def _pick(logits: torch.Tensor, eos_token_ids: set[int], forbid_eos: bool) -> int:
    """Greedy choice from ``[vocab]`` logits, the EOS ids excluded while ``forbid_eos``."""
    if forbid_eos and eos_token_ids:
        logits = logits.clone()
        logits[sorted(eos_token_ids)] = float("-inf")
    return int(logits.argmax())


@torch.inference_mode()
def greedy_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    method: CompressionMethod,
    budget: int | None,
    max_new_tokens: int,
    eos_token_ids: set[int],
    on_step=None,
    min_new_tokens: int = 0,
    observer=None,
    question_start: int | None = None,
    storage: StorageKind = SlotStore,
) -> GenerationResult:
    """Greedy decoding of one prompt through the cache seam.

    Parameters
    ----------
    model : torch.nn.Module
        A causal LM loaded with ``attn_implementation="kvbench"``.
    input_ids : torch.Tensor
        ``[1, prompt]`` token ids.
    method : CompressionMethod
        Compression rules.
    budget : int | None
        Slots per (layer, KV head), resolved for this prompt; None for no compression.
    max_new_tokens : int
        Tokens to generate at most.
    eos_token_ids : set[int]
        Generation stops after any of these.
    on_step : callable, optional
        Called as ``on_step(cache)`` after the prefill and after every decode step (tests use it
        to check invariants at each step).
    min_new_tokens : int
        The end-of-generation ids are masked out of the first ``min_new_tokens`` tokens (the
        ``min_length = prompt + 1`` of the LongBench scripts is 1).
    observer : callable, optional
        Handed to the attention function as ``kvbench_observer`` (``methods.seam.attention``).
    question_start : int | None
        Query-agnostic compression: the prefill takes the prompt's first ``question_start`` tokens
        (the context, compressed by the method), then the rest (the question) is appended as one
        chunk (:meth:`ModelRun.append`). None: the whole prompt is the prefill (query-aware).
    storage : StorageKind
        The run's storage kind (``runners.setup.quant_kind.storage_of``).

    Returns
    -------
    GenerationResult

    Raises
    ------
    ValueError
        If the batch size is not 1, ``max_new_tokens`` < 1, or ``question_start`` does not leave at
        least one token on each side.
    """
    run, logits, seconds = prefill_prompt(
        model, input_ids, method, budget, max_new_tokens, question_start, observer, storage
    )
    row = begin_generation(
        run, input_ids, logits, budget, max_new_tokens, eos_token_ids, seconds, min_new_tokens
    )
    return finish_generation(row, on_step)


def prefill_prompt(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    method: CompressionMethod,
    budget: int | None,
    max_new_tokens: int,
    question_start: int | None = None,
    observer=None,
    storage: StorageKind = SlotStore,
) -> tuple[ModelRun, torch.Tensor, float]:
    """Prefill one prompt ``[1, prompt]`` into a new cache sized for ``max_new_tokens`` more: the whole
    prompt, or its first ``question_start`` tokens (the context of a query-agnostic run; the question
    is appended by :func:`begin_generation`). Returns the run, the last position's logits ``[1, vocab]``
    and the prefill's wall time (seconds). The cache holds the run's storage kind ``storage``.

    Raises
    ------
    ValueError
        If the batch size is not 1, ``max_new_tokens`` < 1, or ``question_start`` does not leave at
        least one token on each side.
    """
    if input_ids.shape[0] != 1:
        raise ValueError(f"a generation takes one prompt at a time, got batch {input_ids.shape[0]}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if question_start is not None and not 0 < question_start < input_ids.shape[1]:
        raise ValueError(f"question_start must be in [1, {input_ids.shape[1] - 1}], got {question_start}")
    run = ModelRun(model, method, budget, input_ids.shape[1] + max_new_tokens - 1, observer, storage=storage)
    start = time.perf_counter()
    logits = run.prefill(input_ids if question_start is None else input_ids[:, :question_start])
    return run, logits, time.perf_counter() - start


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


@torch.inference_mode()
def finish_generation(row: Row, on_step=None) -> GenerationResult:
    """Greedy decoding of a row begun by :func:`begin_generation` until it is done; ``on_step`` as
    :func:`greedy_generate` (after the first token and after every decode step). Returns the row's
    :class:`GenerationResult`."""
    if on_step is not None:
        on_step(row.run.cache)
    while not row.done():
        step_rows([row])
        if on_step is not None:
            on_step(row.run.cache)
    return end_generation(row.run, row.result)


def step_rows(rows: list[Row]) -> None:
    """One decode step of every row (its last token, at its own position, on its own cache) and its
    greedy next token: one row takes its run's own step (eager or compiled), several rows one eager
    forward (:func:`runners.generation.model_run.forward_rows`). Each row records the step's wall time."""
    device = rows[0].run.cache.layers[0].keys.device
    tokens = torch.tensor([row.result.tokens[-1] for row in rows], device=device)
    start = time.perf_counter()
    if len(rows) == 1:
        logits = rows[0].run.step(tokens)
    else:
        logits = forward_rows(rows[0].run.model, [row.run for row in rows], tokens)
    seconds = time.perf_counter() - start
    for row, row_logits in zip(rows, logits, strict=True):
        add_token(row.result, row_logits, row.eos_token_ids, row.min_new_tokens, seconds)


def begin_generation(
    run: ModelRun,
    input_ids: torch.Tensor,
    logits: torch.Tensor,
    budget: int | None,
    max_new_tokens: int,
    eos_token_ids: set[int],
    prefill_seconds: float = 0.0,
    min_new_tokens: int = 0,
) -> Row:
    """Greedy decoding after a prefill, up to the first token: the realised prompt compression is
    read, the rest of the prompt (``input_ids[:, run.seen:]``, the question of a query-agnostic run)
    appended as one chunk, the first token picked (the decode steps: :func:`finish_generation`).

    Parameters
    ----------
    run : ModelRun
        Its cache holds the prefilled prompt tokens (by :meth:`ModelRun.prefill`, or by a shared
        prefill: ``runners.generation.shared_prefill``).
    input_ids : torch.Tensor
        ``[1, prompt]`` the whole prompt.
    logits : torch.Tensor
        ``[1, vocab]`` logits of the last prefilled position.
    prefill_seconds : float
        Seconds already spent on the prefill; the chunk's time is added.
    budget, max_new_tokens, eos_token_ids, min_new_tokens
        As :func:`greedy_generate`.

    Returns
    -------
    Row
        The prompt as a row to decode: its result holds the first token, and its
        ``prefill_seconds`` include the chunk.
    """
    cache = run.cache
    prefill_tokens = run.seen
    prefill_slots, head_slots = cache.real_slots(), cache.head_spread()
    start = time.perf_counter()
    if run.seen < input_ids.shape[1]:
        logits = run.append(input_ids[:, run.seen :])
    token = _pick(logits[0], eos_token_ids, min_new_tokens > 0)
    seconds = prefill_seconds + time.perf_counter() - start
    result = GenerationResult(tokens=[token], prefill_seconds=seconds, budget=budget)
    result.prefill_slots, result.prefill_head_slots = prefill_slots, head_slots
    result.prefill_tokens = prefill_tokens
    return Row(run, result, max_new_tokens, eos_token_ids, min_new_tokens)


def generation_done(result: GenerationResult, eos_token_ids: set[int], max_new_tokens: int) -> bool:
    """Whether generation stops: the last token ends it, or ``max_new_tokens`` are generated."""
    return result.tokens[-1] in eos_token_ids or len(result.tokens) >= max_new_tokens


def add_token(
    result: GenerationResult,
    logits: torch.Tensor,
    eos_token_ids: set[int],
    min_new_tokens: int,
    seconds: float,
) -> None:
    """Pick the greedy token of one decode step's logits ``[vocab]`` (the end-of-generation ids masked
    out while fewer than ``min_new_tokens`` tokens exist) and record it with the step's wall time."""
    result.tokens.append(_pick(logits, eos_token_ids, len(result.tokens) < min_new_tokens))
    result.step_seconds.append(seconds)


def end_generation(run: ModelRun, result: GenerationResult) -> GenerationResult:
    """Read the cache's final slots, bytes and counters into ``result`` (returned)."""
    cache = run.cache
    result.slots = cache.n_slots
    result.kv_bytes = cache.kv_bytes()
    result.allocated_bytes = cache.allocated_bytes()
    result.state_bytes = cache.state_bytes()
    result.counters = cache.counters()
    result.fullkv_bytes = cache.fullkv_bytes()
    return result
