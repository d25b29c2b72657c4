"""Timed decoding for efficiency measurement: a batch of equal-length prompts, a fixed number of
greedy decode steps (no end-of-sequence stop), each phase timed (CUDA synchronised), KV bytes and
a context-growth curve; used by ``runner=efficiency``, ``runner=oom`` and ``scripts/bench_*``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from methods.seam.contract import CompressionMethod
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.generation.model_run import ModelRun
from runners.output.environment import rss_bytes


def synthetic_prompts(vocab_size: int, batch: int, length: int, seed: int) -> torch.Tensor:
    """``[batch, length]`` random token ids in ``[100, vocab_size)`` (special ids avoided), seeded:
    the efficiency runner's and benchmarks' prompts (decode cost does not depend on the text)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab_size, (batch, length), generator=gen)


def call_ms(fn: Callable[[], object], cuda: bool) -> float:
    """Milliseconds of one call ``fn()``: timed by CUDA events with ``cuda``, by wall time otherwise."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t)


def save_figures(out: dict, path: str | None) -> None:
    """Write a benchmark's figures so far to ``path`` (JSON), if given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=2))


@dataclass
class TimedRun:
    """Output of :func:`timed_generate`: one batch, a fixed number of decode steps.

    Attributes
    ----------
    prefill_seconds : float
        Wall time of the prompt forward with compression (seconds; CUDA synchronised).
    step_seconds : list[float]
        Wall time of each decode step (seconds), one token per row of the batch per step.
    kv_bytes, allocated_bytes, state_bytes, fullkv_bytes : int
        At the end: bytes of the held keys/values (exact, from slot counts), of the storage behind
        all slot tensors (buffer capacity included), of the method's per-slot state, and of the
        keys/values an uncompressed cache would hold for the same tokens.
    slots : list[int]
        Slots per layer at the end (per KV head; ragged heads: the longest head's).
    held_slots : list[int]
        Slots per layer at the end summed over the batch and every KV head (ragged heads each
        count their own).
    curve : list[dict]
        Every ``curve_every`` steps: ``context`` (tokens seen), ``step_ms`` (median over the
        window), ``tokens_per_s`` (batch x steps / seconds over the window), ``kv_bytes``,
        ``allocated_bytes``, ``memory_bytes`` (CUDA ``memory_allocated`` or CPU RSS).
    tokens : torch.Tensor
        ``[batch, 1 + steps]`` generated ids.
    """

    prefill_seconds: float
    step_seconds: list[float]
    kv_bytes: int
    allocated_bytes: int
    state_bytes: int
    fullkv_bytes: int
    slots: list[int]
    held_slots: list[int]
    curve: list[dict]
    tokens: torch.Tensor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Decoder:
    """A batch of equal-length prompts prefilled into a compressed cache, then decoded one greedy
    step at a time (no end-of-sequence stop): the timing loop of :func:`timed_generate`, and of the
    benchmark, which alternates the steps of two decoders so that machine drift hits both alike.

    Parameters
    ----------
    model : torch.nn.Module
        A causal LM loaded with ``attn_implementation="kvbench"``.
    input_ids : torch.Tensor
        ``[batch, prompt]`` token ids, no padding (every row has the same length, so no slot is
        padding and the budget holds real tokens only).
    method : CompressionMethod
        Compression rules.
    budget : int | None
        Slots per (layer, KV head); None for no compression.
    max_tokens : int | None
        Tokens the run will append at most (prompt + steps), when known: caps the cache's buffers.
    storage : StorageKind
        The run's storage kind (``runners.setup.quant_kind.storage_of``).

    Attributes
    ----------
    prefill_seconds : float
        Wall time of the prompt forward with compression (seconds; CUDA synchronised).
    cache : CompressedCache
    tokens : list[torch.Tensor]
        ``[batch]`` token ids: the prefill's, then one per step.

    Raises
    ------
    ValueError
        For an empty batch.
    """

    @torch.inference_mode()
    def __init__(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        method: CompressionMethod,
        budget: int | None,
        max_tokens: int | None = None,
        storage: StorageKind = SlotStore,
    ) -> None:
        if input_ids.numel() == 0:
            raise ValueError(f"need a non-empty batch, got shape {tuple(input_ids.shape)}")
        run = ModelRun(model, method, budget, max_tokens, storage=storage)
        _sync(input_ids.device)
        start = time.perf_counter()
        token = run.prefill(input_ids).argmax(dim=-1)
        _sync(input_ids.device)
        self._prefilled(model, input_ids, run, token, time.perf_counter() - start)

    def _prefilled(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        run: ModelRun,
        token: torch.Tensor,
        seconds: float,
    ) -> None:
        """Hold ``run`` (its cache prefilled with ``input_ids``), the prefill's tokens ``token`` ``[batch]``
        and its wall time ``seconds``."""
        self.model, self.device = model, input_ids.device
        self.batch, self.length = input_ids.shape
        self.run, self.cache = run, run.cache
        self.tokens, self.prefill_seconds = [token], seconds

    @classmethod
    @torch.inference_mode()
    def shared(
        cls,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        settings: list[tuple[CompressionMethod, int | None]],
        max_tokens: int | None = None,
    ) -> list[Decoder]:
        """One decoder per ``(method, budget)`` setting over one prefill forward: FullKV's, whose
        observer hands every layer's queries, keys and values to each setting's cache, compressed as
        in its own prefill (``runners.generation.shared_prefill.PrefillFanout``); a FullKV setting's
        cache is the forward's own (no second copy of the prompt's keys and values). A long prompt's
        prefill (minutes on a CPU at a 7B shape) then runs once for a speed comparison. Each
        decoder's ``prefill_seconds`` is the shared forward's.

        Raises
        ------
        ValueError
            For an empty batch or a probing method (it runs forwards of its own: not shared).
        """
        from methods import CompressedCache, FullKV
        from runners.generation.shared_prefill import fanout_prefill

        if input_ids.numel() == 0:
            raise ValueError(f"need a non-empty batch, got shape {tuple(input_ids.shape)}")
        if any(method.traits.probes for method, _ in settings):
            raise ValueError("a probing method runs its own forwards: its prefill is not shared")
        caches = [CompressedCache.for_model(model, m, b, max_tokens, SlotStore) for m, b in settings]
        full = [i for i, (m, b) in enumerate(settings) if isinstance(m, FullKV) and b is None][:1]
        fed = [c for i, c in enumerate(caches) if i not in full]
        _sync(input_ids.device)
        start = time.perf_counter()
        token = fanout_prefill(model, input_ids, fed, caches[full[0]] if full else None).argmax(dim=-1)
        _sync(input_ids.device)
        seconds = time.perf_counter() - start
        decoders = []
        for cache, (method, budget) in zip(caches, settings, strict=True):
            decoder = cls.__new__(cls)
            decoder._prefilled(model, input_ids, ModelRun(model, method, budget, cache=cache), token, seconds)
            decoders.append(decoder)
        return decoders

    @torch.inference_mode()
    def step(self) -> float:
        """One decode step for every row; returns its wall time (seconds; CUDA synchronised)."""
        start = time.perf_counter()
        self.tokens.append(self.run.step(self.tokens[-1]).argmax(dim=-1))
        _sync(self.device)
        return time.perf_counter() - start


def timed_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    method: CompressionMethod,
    budget: int | None,
    steps: int,
    curve_every: int = 0,
    storage: StorageKind = SlotStore,
) -> TimedRun:
    """Prefill a batch of equal-length prompts, then exactly ``steps`` greedy decode steps (no
    end-of-sequence stop), timing each phase; the efficiency runner's loop.

    Parameters
    ----------
    model, input_ids, method, budget
        As :class:`Decoder`.
    steps : int
        Decode steps (tokens per row after the first).
    curve_every : int
        Record a context-growth point every this many steps (0: none).
    storage : StorageKind
        The run's storage kind (``runners.setup.quant_kind.storage_of``).

    Returns
    -------
    TimedRun

    Raises
    ------
    ValueError
        For ``steps`` < 0 or an empty batch.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    decoder = Decoder(model, input_ids, method, budget, input_ids.shape[1] + steps, storage)
    cache, device, batch = decoder.cache, decoder.device, decoder.batch
    step_seconds: list[float] = []
    curve: list[dict] = []
    for i in range(steps):
        step_seconds.append(decoder.step())
        if curve_every and (i + 1) % curve_every == 0:
            window = sorted(step_seconds[-curve_every:])
            memory = torch.cuda.memory_allocated(device) if device.type == "cuda" else rss_bytes()
            curve.append(
                {
                    "context": decoder.length + i + 1,
                    "step_ms": 1000 * window[len(window) // 2],
                    "tokens_per_s": batch * len(window) / sum(window),
                    "kv_bytes": cache.kv_bytes(),
                    "allocated_bytes": cache.allocated_bytes(),
                    "memory_bytes": memory,
                }
            )
    return TimedRun(
        prefill_seconds=decoder.prefill_seconds,
        step_seconds=step_seconds,
        kv_bytes=cache.kv_bytes(),
        allocated_bytes=cache.allocated_bytes(),
        state_bytes=cache.state_bytes(),
        fullkv_bytes=cache.fullkv_bytes(),
        slots=cache.n_slots,
        held_slots=[int(layer.store.head_slots().sum()) for layer in cache.layers],
        curve=curve,
        tokens=torch.stack(decoder.tokens, dim=1),
    )
