"""Quality runner: greedy generation over a task's samples with one method at one budget.

Order of work (bad input fails before anything expensive): the settings, checked at the door
(``runners.setup.settings.read_settings``) -> build method and task (``runners.setup.build``)
-> read data -> tokenize and check prompt lengths -> load model -> generate -> score -> record
(atomic) -> loggers -> summary table.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from omegaconf import DictConfig
from tqdm import tqdm

from methods import CompressionMethod
from methods.seam.architecture import layer_specs
from methods.seam.plan import Slots
from methods.seam.sliding import layer_protocol
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.generation.batched import decode_rows, start_row
from runners.generation.greedy import GenerationResult, Row, eos_token_ids
from runners.models.loading import load_model
from runners.output.quality_record import close_record, prediction_row
from runners.output.record import new_record, recording, run_config, stored_run
from runners.output.summary_table import print_summary
from runners.setup.budget import resolve_budget
from runners.setup.build import build_components, load_prompts, refuse_untrained, run_budget
from runners.setup.decode_rule import decoding_protocol
from runners.setup.quant_kind import storage_of
from runners.setup.settings import RunSettings
from runners.sweeps.shards import check_shards, merge_when_complete, shard_samples
from tasks import Task
from tasks.errors import KVBenchError


def stop_token_ids(tokenizer, strings: tuple[str, ...]) -> set[int]:
    """Token ids of extra stop strings (the last token of each, as THUDM's ``pred.py`` takes "\\n")."""
    return {tokenizer.encode(text, add_special_tokens=False)[-1] for text in strings}


def check_batch_size(settings: RunSettings) -> int:
    """``runner.batch_size``: prompts whose decode steps run in one forward (``runners.generation.batched``).

    Raises
    ------
    KVBenchError
        For a size that is not a positive integer, or a batch above 1 with ``backend=compiled`` (the
        compiled step is of one cache; batched steps run eagerly) or a quantized ``quant=``.
    """
    size = settings.runner.batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise KVBenchError(f"runner.batch_size must be a positive integer, got {size!r}")
    if size > 1 and settings.backend != "eager":
        raise KVBenchError(
            f"runner.batch_size={size} runs eager decode steps (each row on its own cache); "
            "backend=compiled takes runner.batch_size=1"
        )
    quant = settings.quant.name
    if size > 1 and quant != "none":  # as runners.sweeps.grid_settings refuses a grid's quantized settings
        raise KVBenchError(
            f"runner={settings.runner.name} with quant={quant} takes runner.batch_size=1 (got {size}): "
            "batched rows round differently from one row's, and quantized codes turn that into other tokens"
        )
    return size


def check_lengths(model: DictConfig, task: Task, samples: list, prompts: list) -> None:
    """Check that every prompt plus its new tokens fits the context of ``model`` (the run's resolved
    model node: ``model.max_context``).

    Raises
    ------
    KVBenchError
        Naming the longest prompt that does not fit.
    """
    need, longest, new = max((p.shape[1] + task.max_new(s), p.shape[1], task.max_new(s))
                             for p, s in zip(prompts, samples, strict=True))  # fmt: skip
    if need > model.max_context:
        raise KVBenchError(
            f"a prompt of {longest} tokens + {new} new tokens exceeds the context of "
            f"{model.name} ({model.max_context} tokens); lower task.max_input_tokens or the length"
        )


def question_starts(tokenizer, task: Task, samples: list, prompts: list) -> list[int | None]:
    """Where each prompt's uncompressed chunk starts (``Task.chunk_start``): the question's first
    token when the task is run query-agnostic (``task.query_aware=false``: the context is
    compressed, then the question is appended); for RULER run query-aware, the first token after
    the question (end of turn, generation prompt, answer prefix: kvpress's ``compress_questions``);
    None where the whole prompt is compressed.

    Raises
    ------
    KVBenchError
        If the task has no context/question split for a sample.
    """
    return [task.chunk_start(tokenizer, s, p) for s, p in zip(samples, prompts, strict=True)]


def check_budgets(
    settings: RunSettings,
    method: CompressionMethod,
    budget: float | int | None,
    samples: list,
    prompts: list,
    task: Task,
    starts: list[int | None],
    questions: list[int | None] | None = None,
) -> list[int | None]:
    """Each sample's slot budget (``runners.setup.budget.resolve_budget``; a prompt fraction is of
    the tokens the prefill compresses: the whole prompt, or the tokens before the appended chunk
    (``starts``), as kvpress's compression ratio; a context fraction is of
    ``model.max_context``), checked with the method (``CompressionMethod.check_budget``) before any
    model loads. ``questions`` (:func:`question_tokens`): a budget then carries its sample's question
    length (``Slots.question``, FINCH's window).

    Raises
    ------
    KVBenchError
        Naming the first sample whose budget the method cannot work with.
    """
    out = []
    for sample, ids, start in zip(samples, prompts, starts, strict=True):
        compressed = ids.shape[1] if start is None else start
        slots = resolve_budget(budget, compressed, settings.model.max_context, settings.budget_unit)
        if slots is not None:
            try:
                method.check_budget(slots, ids.shape[1] + task.max_new(sample))
            except ValueError as err:
                unit = settings.budget_unit
                raise KVBenchError(
                    f"sample {sample.id}: budget={budget} ({unit}) gives {slots} slots for its "
                    f"{compressed}-token {'prompt' if start is None else 'compressed part'}: {err}"
                ) from err
        question = None if questions is None else questions[len(out)]
        if slots is not None and question is not None:
            slots = Slots(slots, getattr(slots, "share", None), question)  # an absolute budget: no share
        out.append(slots)
    return out


def question_tokens(tokenizer, task: Task, samples: list, prompts: list, starts: list) -> list[int | None]:
    """Per sample, the question's tokens at the end of the compressed prompt (``Task.question_start``
    to ``starts``' end of compression): a query-aware run of a task with a question (kvpress's
    FinchPress window); None where the question is appended after compression or there is none."""
    out = []
    for sample, ids, start in zip(samples, prompts, starts, strict=True):
        compressed = ids.shape[1] if start is None else start
        try:
            first = task.question_start(tokenizer, sample, ids)
        except KVBenchError:
            first = compressed
        out.append(compressed - first if first < compressed else None)
    return out


def sample_rows(
    model, tokenizer, task: Task, method: CompressionMethod, samples: list, prompts: list, budgets: list,
    starts: list, eos: set[int], storage: StorageKind = SlotStore,
) -> list[tuple[int, Callable[[], Row]]]:  # fmt: skip
    """``(sample index, start)`` per sample of ``task`` (``samples``, their ``prompts``), for
    :func:`runners.generation.batched.decode_rows`: ``start()`` prefills the sample
    (:func:`runners.generation.batched.start_row`) with its budget, question start, new-token limit and stop
    tokens (EOS ids ``eos`` plus the sample's stop strings), each on a cache of the run's ``storage`` kind."""

    def begin(i: int) -> Callable[[], Row]:
        return lambda: start_row(
            model, prompts[i].to(model.device), method, budgets[i], task.max_new(samples[i]),
            eos | stop_token_ids(tokenizer, samples[i].stop_strings),
            min_new_tokens=task.min_new_tokens, question_start=starts[i], storage=storage,
        )  # fmt: skip

    return [(i, begin(i)) for i in range(len(samples))]


def run_quality(settings: RunSettings) -> dict:
    """Run (or reuse) one quality job of ``settings`` (made at the door) and return its record. The
    composed config (``settings.config``) is read for the run's identity and record only.

    Raises
    ------
    KVBenchError
        For bad input, before any model is loaded (or before generation for too-long prompts).
    """
    cfg = settings.config
    refuse_untrained(settings)
    batch_size = check_batch_size(settings)
    check_shards(cfg)
    method, task = build_components(settings)
    storage = storage_of(settings, method)
    config = run_config(cfg, method.traits.budget_applies)
    tokenizer, every, prompts = load_prompts(settings.model, task)
    samples, prompts = shard_samples(cfg, every, prompts)  # the run is identified by every sample
    store, rid, done = stored_run(cfg, config, print_summary, every)
    if done is not None:
        merge_when_complete(cfg, store, rid, task, every)
        return done
    check_lengths(settings.model, task, samples, prompts)
    starts = question_starts(tokenizer, task, samples, prompts)
    questions = question_tokens(tokenizer, task, samples, prompts, starts)
    budgets = check_budgets(
        settings, method, run_budget(settings, method), samples, prompts, task, starts, questions
    )
    print(f"loading model {settings.model.name}", flush=True)
    model = load_model(settings.model, settings.device)
    eos = eos_token_ids(model, tokenizer)
    record = new_record(
        rid,
        config,
        method.label,
        task.name,
        model.device,
        data_source=task.source,
        protocol=task.protocol()
        | {"eos_token_ids": sorted(eos)}
        | layer_protocol(layer_specs(model))
        | decoding_protocol(method),
        n_samples=len(samples),
    )
    results: list[GenerationResult] = []
    predictions: list[dict] = []
    done: list[int] = []  # sample index of each result, in the order they ended

    with recording(cfg, store, record, predictions, lambda: record.update(samples_done=len(results))):
        print(f"generating {len(samples)} sample(s)", flush=True)
        start = time.perf_counter()
        starting = sample_rows(
            model, tokenizer, task, method, samples, prompts, budgets, starts, eos, storage
        )
        rows = decode_rows(starting, batch_size)
        for i, res in tqdm(rows, total=len(samples), desc=method.label, disable=not settings.runner.progress):
            done.append(i)
            results.append(res)
            predictions.append(prediction_row(tokenizer, samples[i], prompts[i], starts[i], res))
        order = sorted(range(len(done)), key=done.__getitem__)  # sample order, whatever the batch
        results[:], predictions[:] = [results[j] for j in order], [predictions[j] for j in order]
        close_record(record, task, samples, prompts, results, predictions, model.device)
        record["efficiency"]["samples_per_s"] = len(samples) / (time.perf_counter() - start)
    print_summary(record)
    merge_when_complete(cfg, store, rid, task, every)
    return record
