"""Our own greedy loop: prefill, then one token per decode step, with the compressed cache
(:class:`ModelRun`, the one model-call loop, shared with the timing loop of ``runners.timing``).

The decode step runs eagerly (the reference) or compiled (config ``backend=compiled``:
``torch.compile`` of the model's one-token forward, cache seam and method included; CUDA graphs
on CUDA via ``mode="reduce-overhead"``). The prefill always runs eagerly.
"""

from __future__ import annotations

import time

import torch

from kernels.switch import Switch
from methods.seam.cache import CompressedCache
from methods.seam.contract import CompressionMethod
from runners.generation_result import GenerationResult

__all__ = [
    "GenerationResult",
    "ModelRun",
    "add_token",
    "begin_generation",
    "end_generation",
    "eos_token_ids",
    "finish_generation",
    "generation_done",
    "greedy_generate",
    "prefill_prompt",
]


BACKENDS = ("eager", "compiled")
#: How decode steps run: ``eager`` (the reference) or ``compiled`` (:func:`compiled_forward`).
DECODE_BACKEND = Switch("backend", BACKENDS, "eager")
set_decode_backend, get_decode_backend = DECODE_BACKEND.set, DECODE_BACKEND.get


def compiled_forward(model: torch.nn.Module):
    """``torch.compile`` of ``model``'s forward, made once per model and kept on the model object
    (not as a submodule). Inductor on every device; on CUDA ``mode="reduce-overhead"`` (CUDA graphs
    over the whole step), the whole step as one graph (``fullgraph``: a method that breaks the graph
    raises instead of running partly eager). Integers start static; the token position, which
    changes at every step, becomes symbolic after the first recompilation (Dynamo's automatic
    dynamic shapes), and a compressing layer has the same shapes at every step once it is full."""
    fn = model.__dict__.get("_kvbench_compiled")
    if fn is None:
        torch._dynamo.reset()  # one model per run: earlier models' graphs would count towards the limit
        # a graph break or a recompilation past the limit raises instead of falling back to eager
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        mode = "reduce-overhead" if next(model.parameters()).is_cuda else None
        fn = torch.compile(model.forward, mode=mode, fullgraph=True)
        model.__dict__["_kvbench_compiled"] = fn
    return fn


class ModelRun:
    """One model over one compressed cache: KVBench's only model-call loop (prefill, then one
    token per row and decode step), used by :func:`greedy_generate` and by the timing loop
    (``runners.timing.Decoder``). Positions are the true token indices; the cache is handed to
    the attention function explicitly (``kvbench_cache``), since ``model.generate`` rejects
    unknown keyword arguments.

    Parameters
    ----------
    model : torch.nn.Module
        A causal LM loaded with ``attn_implementation="kvbench"``.
    method : CompressionMethod
        Compression rules.
    budget : int | None
        Slots per (layer, KV head); None for no compression.
    max_tokens : int | None
        Tokens the run appends at most (caps the cache's buffers; ``CompressedCache``).
    observer : callable, optional
        Handed to the attention function as ``kvbench_observer`` (``methods.seam.attention``).
    backend : str | None
        ``eager`` or ``compiled`` decode steps (:func:`compiled_forward`); None: the configured
        one (:func:`set_decode_backend`). An observer forces eager steps (it is Python called per layer).
    cache : CompressedCache | None
        A cache that already holds a prefilled prompt (a shared prefill,
        ``runners.shared_prefill``); ``method``, ``budget`` and ``max_tokens`` are then its own.

    Raises
    ------
    ValueError
        For an unknown backend.

    Attributes
    ----------
    cache : CompressedCache
    seen : int
        Tokens fed so far (the position of the next one).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        method: CompressionMethod,
        budget: int | None,
        max_tokens: int | None = None,
        observer=None,
        backend: str | None = None,
        cache: CompressedCache | None = None,
    ) -> None:
        self.model, self.observer = model, observer
        self.cache = CompressedCache.for_model(model, method, budget, max_tokens) if cache is None else cache
        self.seen = self.cache.get_seq_length()
        self.backend = get_decode_backend() if backend is None else backend
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        compiled = self.backend == "compiled" and observer is None
        self._decode = compiled_forward(model) if compiled else model

    def _forward(self, forward, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        batch, new = input_ids.shape
        positions = torch.arange(self.seen, self.seen + new, device=input_ids.device).expand(batch, new)
        out = forward(
            input_ids=input_ids,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            kvbench_cache=self.cache,
            kvbench_observer=self.observer,
            **kwargs,
        )
        self.seen += new
        return out.logits[:, -1]

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Feed the prompts ``[batch, prompt]`` (equal length, no padding); returns the last
        position's logits ``[batch, vocab]``."""
        return self._forward(self.model, input_ids, logits_to_keep=1)

    def append(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Feed a chunk ``[batch, chunk]`` after the prefill (a question appended to the compressed
        context: ``methods.seam.step.chunk_step``), eagerly; returns the last position's logits
        ``[batch, vocab]``."""
        return self._forward(self.model, input_ids, logits_to_keep=1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``[batch]``); returns the logits ``[batch, vocab]``."""
        return self._forward(self._decode, tokens[:, None])


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
        model, input_ids, method, budget, max_new_tokens, question_start, observer
    )
    return finish_generation(
        run, input_ids, logits, budget, max_new_tokens, eos_token_ids, seconds, on_step, min_new_tokens
    )


def prefill_prompt(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    method: CompressionMethod,
    budget: int | None,
    max_new_tokens: int,
    question_start: int | None = None,
    observer=None,
) -> tuple[ModelRun, torch.Tensor, float]:
    """Prefill one prompt ``[1, prompt]`` into a new cache sized for ``max_new_tokens`` more: the whole
    prompt, or its first ``question_start`` tokens (the context of a query-agnostic run; the question
    is appended by :func:`begin_generation`). Returns the run, the last position's logits ``[1, vocab]``
    and the prefill's wall time (seconds).

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
    run = ModelRun(model, method, budget, input_ids.shape[1] + max_new_tokens - 1, observer)
    start = time.perf_counter()
    logits = run.prefill(input_ids if question_start is None else input_ids[:, :question_start])
    return run, logits, time.perf_counter() - start


@torch.inference_mode()
def finish_generation(
    run: ModelRun,
    input_ids: torch.Tensor,
    logits: torch.Tensor,
    budget: int | None,
    max_new_tokens: int,
    eos_token_ids: set[int],
    prefill_seconds: float = 0.0,
    on_step=None,
    min_new_tokens: int = 0,
) -> GenerationResult:
    """Greedy decoding after a prefill: the rest of the prompt (``input_ids[:, run.seen:]``, the
    question of a query-agnostic run) is appended as one chunk, then tokens are generated.

    Parameters
    ----------
    run : ModelRun
        Its cache holds the prefilled prompt tokens (by :meth:`ModelRun.prefill`, or by a shared
        prefill: ``runners.shared_prefill``).
    input_ids : torch.Tensor
        ``[1, prompt]`` the whole prompt.
    logits : torch.Tensor
        ``[1, vocab]`` logits of the last prefilled position.
    prefill_seconds : float
        Seconds already spent on the prefill; the chunk's time is added.
    budget, max_new_tokens, eos_token_ids, on_step, min_new_tokens
        As :func:`greedy_generate`.

    Returns
    -------
    GenerationResult
    """
    result = begin_generation(run, input_ids, logits, budget, eos_token_ids, prefill_seconds, min_new_tokens)
    if on_step is not None:
        on_step(run.cache)
    while not generation_done(result, eos_token_ids, max_new_tokens):
        start = time.perf_counter()
        logits = run.step(torch.tensor([result.tokens[-1]], device=input_ids.device))
        add_token(result, logits[0], eos_token_ids, min_new_tokens, time.perf_counter() - start)
        if on_step is not None:
            on_step(run.cache)
    return end_generation(run, result)


def begin_generation(
    run: ModelRun,
    input_ids: torch.Tensor,
    logits: torch.Tensor,
    budget: int | None,
    eos_token_ids: set[int],
    prefill_seconds: float = 0.0,
    min_new_tokens: int = 0,
) -> GenerationResult:
    """The part of :func:`finish_generation` before the decode steps: the realised prompt compression
    is read, the question chunk (``input_ids[:, run.seen:]``) appended, the first token picked.

    Returns
    -------
    GenerationResult
        With its first token; ``prefill_seconds`` includes the chunk.
    """
    cache = run.cache
    prefill_tokens = run.seen
    prefill_slots, head_slots = [layer.real_slots() for layer in cache.layers], cache.head_spread()
    start = time.perf_counter()
    if run.seen < input_ids.shape[1]:
        logits = run.append(input_ids[:, run.seen :])
    token = _pick(logits[0], eos_token_ids, min_new_tokens > 0)
    seconds = prefill_seconds + time.perf_counter() - start
    result = GenerationResult(tokens=[token], prefill_seconds=seconds, budget=budget)
    result.prefill_slots, result.prefill_head_slots = prefill_slots, head_slots
    result.prefill_tokens = prefill_tokens
    return result


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
