"""One prefill for several (method, budget) settings.

The prefill's attention output is uncompressed in every method (``methods.seam.step.prefill_step``:
each layer's rule compresses the layer *after* its output is computed), so the hidden states of a
prompt's prefill are the same whatever the method and budget. A grid of settings therefore needs the
model's prefill forward once per prompt: one forward (FullKV) whose observer hands every layer's
queries, keys and values to each setting's own cache, where the setting's rule scores and compresses
them exactly as in its own run (:class:`PrefillFanout`); settings whose methods probe the prompt
with the same forwards (KVzip and KVzip layer-wise) share them (:func:`probe_groups`). Each setting
then appends its question chunk (query-agnostic runs) and decodes on its own cache, the settings'
decode steps ``batch_size`` at a time in one forward (``runners.generation.batched``): its tokens are
those of its own :func:`~runners.generation.greedy.greedy_generate` run (tests check it).
"""

from __future__ import annotations

import time
from functools import partial

import torch

from methods import CompressedCache, CompressionMethod, FullKV
from methods.score_memo import shared_scores
from methods.seam.step import prefill_step
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.generation.batched import decode_rows
from runners.generation.greedy import GenerationResult, ModelRun, Row, begin_generation
from runners.generation.model_run import probe_caches


class PrefillFanout:
    """Observer of one prefill forward (``kvbench_observer``, ``methods.seam.attention``): each layer's
    prompt queries ``[batch, q_heads, prompt, head_dim]`` and keys/values ``[batch, kv_heads, prompt,
    head_dim]`` go to the same layer of every cache, whose rule scores and compresses them
    (:func:`~methods.seam.step.prefill_step` without output).

    Parameters
    ----------
    caches : list[CompressedCache]
        Empty caches, one per setting.
    """

    def __init__(self, caches: list[CompressedCache]) -> None:
        self.caches = caches

    def __call__(self, layer_idx: int, query, keys, values, out, scale: float) -> None:
        """Feed one layer's prefill call to every cache (a decode call is not expected); equal score
        computations of several settings run once (``methods.score_memo``)."""
        with shared_scores():
            for cache in self.caches:
                layer = cache.layers[layer_idx]
                if layer.plan is not None:
                    raise RuntimeError("PrefillFanout observes a prefill only")
                layer.update(keys, values)
                prefill_step(cache.rules[layer_idx], layer, query, None, None, scale)


def fanout_prefill(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    caches: list[CompressedCache],
    own: CompressedCache | None = None,
) -> torch.Tensor:
    """One FullKV prefill forward of ``input_ids`` ``[batch, prompt]`` whose observer hands every layer
    to each of ``caches`` (:class:`PrefillFanout`: each compresses as in its own prefill); ``own`` is the
    forward's own FullKV cache (default: a new one sized to the prompt, released after). Returns the
    forward's logits."""
    if own is None:
        own = CompressedCache.for_model(model, FullKV(), None, input_ids.shape[1], SlotStore)
    return ModelRun(model, FullKV(), None, cache=own, observer=PrefillFanout(caches)).prefill(input_ids)


@torch.inference_mode()
def shared_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    settings: list[tuple[CompressionMethod, int | None]],
    max_new_tokens: int,
    eos_token_ids: set[int],
    min_new_tokens: int = 0,
    question_start: int | None = None,
    batch_size: int = 1,
    storages: list[StorageKind] | None = None,
) -> list[GenerationResult]:
    """Greedy decoding of one prompt under several settings with one prefill forward.

    Parameters
    ----------
    settings : list[tuple[CompressionMethod, int | None]]
        ``(method, slot budget)`` per setting (budgets resolved for this prompt).
    model, input_ids, max_new_tokens, eos_token_ids, min_new_tokens, question_start
        As :func:`runners.generation.greedy.greedy_generate`.
    batch_size : int
        Settings whose decode steps run in one forward (``runners.generation.batched``; 1: one by one).
    storages : list[StorageKind] | None
        Each setting's storage kind (a grid over ``quant=``); None: full precision for every setting.
        The shared forward's own cache is full precision.

    Returns
    -------
    list[GenerationResult]
        One per setting, in order. ``prefill_seconds`` is the shared forward's wall time (every
        setting's compression included, with the probe forwards of the probing methods, run once for
        each group of settings that probe alike: :func:`probe_groups`) plus the setting's own
        question chunk.

    Raises
    ------
    ValueError
        If the prompt batch is not 1, no setting is given, ``question_start`` is out of range or
        ``batch_size`` < 1, or ``storages`` is not one per setting.
    """
    if input_ids.shape[0] != 1 or not settings:
        raise ValueError("shared_generate takes one prompt and at least one setting")
    if question_start is not None and not 0 < question_start < input_ids.shape[1]:
        raise ValueError(f"question_start must be in [1, {input_ids.shape[1] - 1}], got {question_start}")
    if storages is not None and len(storages) != len(settings):
        raise ValueError(f"{len(storages)} storage kinds for {len(settings)} settings")
    most = input_ids.shape[1] + max_new_tokens - 1
    kinds = storages or [SlotStore] * len(settings)
    caches = [
        CompressedCache.for_model(model, method, budget, most, kind)
        for (method, budget), kind in zip(settings, kinds, strict=True)
    ]
    prefix = input_ids if question_start is None else input_ids[:, :question_start]
    start = time.perf_counter()
    logits = fanout_prefill(model, prefix, caches)
    for group in probe_groups(caches, kinds, prefix):  # a probing method's own forwards (KVzip)
        probe_caches(model, group, prefix)
    seconds = time.perf_counter() - start

    def begin(cache: CompressedCache, budget: int | None) -> Row:
        run = ModelRun(model, cache.method, budget, cache=cache)
        return begin_generation(
            run, input_ids, logits, budget, max_new_tokens, eos_token_ids, seconds, min_new_tokens
        )

    budgets = [budget for _, budget in settings]
    rows = [(i, lambda c=c, b=b: begin(c, b)) for i, (c, b) in enumerate(zip(caches, budgets, strict=True))]
    out = dict(decode_rows(rows, batch_size))
    return [out[i] for i in range(len(settings))]


def probe_groups(
    caches: list[CompressedCache], kinds: list[StorageKind], prompt: torch.Tensor
) -> list[list[CompressedCache]]:
    """The prefilled caches of probing methods (``methods.probing``) grouped so that each group's
    probe forwards run once (:func:`runners.generation.model_run.probe_caches`): the same storage kind (its
    class and parameters) and the same probe chunks of ``prompt`` ``[1, prompt]`` (KVzip and
    KVzip layer-wise read the same reconstruction forwards), every layer ruled by the method; any
    other probing cache is a group of its own.

    Raises
    ------
    ValueError
        As a method's ``probe_prompts`` (KVzip without its reconstruction prompt).
    """
    groups: dict[object, list[CompressedCache]] = {}
    for i, (cache, kind) in enumerate(zip(caches, kinds, strict=True)):
        if not cache.method.traits.probes:
            continue
        if all(rule is cache.method for rule in cache.rules):
            chunks = tuple((tuple(p.ids[0].tolist()), p.span) for p in cache.method.probe_prompts(prompt))
            storage = (
                (kind.func, kind.args, tuple(sorted(kind.keywords.items())))
                if isinstance(kind, partial)
                else kind
            )
            key: object = (storage, chunks)
        else:
            key = i
        groups.setdefault(key, []).append(cache)
    return list(groups.values())
