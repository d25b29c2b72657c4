"""Quality runs of a grid of settings with one prefill per sample (``runner=quality_grid``).

``python run.py runner=quality_grid task=ruler 'runner.methods=[fullkv,snapkv,tova]'
'runner.compression_ratios=[0.25,0.5,0.75]'`` stores one quality record per (method, budget), under
the run id that ``python run.py method=<m> compression_ratio=<r> task=ruler`` would give it (the same
config: the job's other overrides, the method preset, the ratio or budget). ``'runner.quants=[none,int8]'``
adds the storage kind as an axis (``quant=<q>`` of each setting's own run; each setting's cache holds
its kind, the shared forward's own cache full precision); ``runner.extra_grids`` adds more such products
(``runners.sweeps.grid_settings``). Settings already finished
are skipped; FullKV, which ignores the budget, runs once. Per sample the model's prefill forward runs
once for every setting (``runners.generation.shared_prefill``): the prompt's hidden states do not depend on
the method, since every method computes prefill attention uncompressed; then the settings' decode steps
run ``runner.batch_size`` settings per forward (``runners.generation.batched``; rows of different methods).
Each setting's tokens are those of its own run; its timings are not (``efficiency.prefill_shared_by`` says
by how many settings the prefill forward, their compression included, was shared; ``grid.batch_size``
how many settings shared a decode forward).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

from omegaconf import DictConfig
from tqdm import tqdm

from methods import CompressionMethod
from methods.seam.architecture import layer_specs
from methods.seam.sliding import layer_protocol
from methods.seam.storage import StorageKind
from runners.generation.greedy import GenerationResult, eos_token_ids
from runners.generation.shared_prefill import shared_generate
from runners.models.loading import load_model
from runners.output.quality_record import close_record, prediction_row
from runners.output.record import claim_run, failure, identify_run, new_record, presets, recording, run_config
from runners.quality import (
    check_batch_size,
    check_budgets,
    check_lengths,
    question_starts,
    question_tokens,
    stop_token_ids,
)
from runners.results.sharded import whole_run_id
from runners.results.store import ResultStore, quant_of, setting_id
from runners.setup.build import build_components, load_prompts, refuse_untrained, run_budget
from runners.setup.decode_rule import decoding_protocol
from runners.setup.quant_kind import storage_of
from runners.setup.settings import RunSettings, read_settings
from runners.sweeps.grid_settings import setting_configs
from runners.sweeps.shards import check_shards, merge_when_complete, shard_samples
from runners.sweeps.summary import note_job_runs

#: Peak-memory fields of a quality record, null in a grid's records (the peaks are the grid's).
PEAKS = ("peak_rss_bytes", "peak_rss_process_bytes", "peak_device_bytes", "peak_device_process_bytes")


@dataclass
class Setting:
    """One (method, budget, storage kind) of the grid and its run (``run``: its settings, read at its
    own door from the config the grid composes for it)."""

    run: RunSettings
    preset: str
    method: CompressionMethod
    config: dict
    store: ResultStore
    rid: str
    storage: StorageKind
    budgets: list[int | None] = field(default_factory=list)
    record: dict = field(default_factory=dict)
    results: list[GenerationResult] = field(default_factory=list)
    predictions: list[dict] = field(default_factory=list)

    def count_done(self) -> None:
        """Set the record's ``samples_done`` (called before it is written)."""
        self.record.update(samples_done=len(self.results))


def _prepare(job: RunSettings) -> tuple[list[Setting], list[dict], tuple]:
    """Build and check every setting (no model): the ones to run, the finished records, and the
    shared ``(model config, task, tokenizer, samples, prompts)``. The settings' run locks are taken in run-id
    order (``runners.results.lock``: two grids never wait for each other in a circle)."""
    candidates, seen, shared = [], set(), None
    for preset, scfg in setting_configs(job.config):
        run = read_settings(scfg)
        refuse_untrained(run)
        method, task = build_components(run)
        config = run_config(run.config, method.traits.budget_applies)
        if setting_id(config) in seen:  # FullKV ignores the budget: one run
            continue
        seen.add(setting_id(config))
        if shared is None:
            shared = (run.model, task, *load_prompts(run.model, task))
        store, rid = identify_run(run.config, config, shared[3])
        candidates.append(Setting(run, preset, method, config, store, rid, storage_of(run, method)))
    done = {
        s.rid: claim_run(s.run.config, s.store, s.rid, s.config, lambda r: None)
        for s in sorted(candidates, key=lambda s: s.rid)
    }
    finished = [done[s.rid] for s in candidates if done[s.rid] is not None]
    return [s for s in candidates if done[s.rid] is None], finished, shared


def run_quality_grid(job: RunSettings) -> dict:
    """Run every unfinished setting of the grid of ``job`` (the grid's own settings, read at the door)
    with one prefill per sample; returns a summary
    (``status`` ok when every setting's record is ok; ``runs``: run id -> status).

    Raises
    ------
    KVBenchError
        For bad input (:func:`setting_configs`, and every check of a quality run), before the model
        loads.
    """
    cfg = job.config
    batch_size = check_batch_size(job)
    check_shards(cfg)
    settings, finished, (model, task, tokenizer, every, prompts) = _prepare(job)
    samples, prompts = shard_samples(cfg, every, prompts)
    cfg.model = model  # resolved by the settings' build (model=hf: max_context); a failure record reads it
    check_lengths(model, task, samples, prompts)
    starts = question_starts(tokenizer, task, samples, prompts)
    questions = question_tokens(tokenizer, task, samples, prompts, starts)
    for s in settings:
        s.budgets = check_budgets(
            s.run, s.method, run_budget(s.run, s.method), samples, prompts, task, starts, questions
        )
    print(f"{len(settings)} setting(s) to run, {len(finished)} already finished", flush=True)
    note_job_runs([s.rid for s in settings] + [r["run_id"] for r in finished])
    if settings:
        _run(job, model, settings, task, tokenizer, samples, prompts, starts, batch_size)
    records = finished + [s.record for s in settings]
    for r in records:
        first = next(iter((r.get("metrics") or {}).values()), None)
        print(f"  {r['method']:<28} budget={r['config']['budget']!s:<6} quant={quant_of(r['config']):<6} "
              f"{r['status']:<6} first metric {first}  run {r['run_id']}")  # fmt: skip
    for r in sorted(records, key=lambda r: whole_run_id(r["config"], r.get("inputs"))):  # locks in order
        merge_when_complete(cfg, ResultStore(job.paths.results_dir), r["run_id"], task, every)
    bad = [r for r in records if r["status"] != "ok"]
    return {
        "run_id": "grid",
        "status": "ok" if not bad else bad[0]["status"],
        "error": None if not bad else f"{len(bad)} setting(s) failed, first: {bad[0]['error']}",
        "metrics": {},
        "runs": {r["run_id"]: r["status"] for r in records},
    }


def _run(
    job: RunSettings, node: DictConfig, settings: list[Setting], task, tokenizer, samples, prompts, starts,
    batch_size: int,
) -> None:  # fmt: skip
    """Load the model of ``node`` (the settings' resolved model config) once and run the settings
    sample by sample (records written whatever happens)."""
    print(f"loading model {node.name}", flush=True)
    model = load_model(node, job.device)
    eos = eos_token_ids(model, tokenizer)
    protocol = task.protocol() | {"eos_token_ids": sorted(eos)} | layer_protocol(layer_specs(model))
    grid = {"settings": len(settings), "shared_prefill": True, "batch_size": batch_size}
    with contextlib.ExitStack() as stack:
        for s in settings:
            s.record = new_record(
                s.rid, s.config, s.method.label, task.name, model.device, data_source=task.source,
                protocol=protocol | decoding_protocol(s.method), n_samples=len(samples), grid=grid,
                presets=(presets() or {}) | {"method": s.preset, "runner": "quality"},
            )  # fmt: skip
            stack.enter_context(recording(s.run.config, s.store, s.record, s.predictions, s.count_done))
        print(f"generating {len(samples)} sample(s), {len(settings)} setting(s)", flush=True)
        try:
            for i, (sample, ids) in enumerate(
                tqdm(list(zip(samples, prompts, strict=True)), desc="grid", disable=not job.runner.progress)
            ):
                results = shared_generate(
                    model, ids.to(model.device), [(s.method, s.budgets[i]) for s in settings],
                    task.max_new(sample), eos | stop_token_ids(tokenizer, sample.stop_strings),
                    min_new_tokens=task.min_new_tokens, question_start=starts[i], batch_size=batch_size,
                    storages=[s.storage for s in settings],
                )  # fmt: skip
                for s, res in zip(settings, results, strict=True):
                    s.results.append(res)
                    s.predictions.append(prediction_row(tokenizer, sample, ids, starts[i], res))
            for s in settings:
                close_record(s.record, task, samples, prompts, s.results, s.predictions, model.device)
                # the process's peaks hold every setting's caches: not this setting's own
                s.record["efficiency"] |= dict.fromkeys(PEAKS) | {"prefill_shared_by": len(settings)}
        except BaseException as err:  # every setting's record says how the grid ended
            stopped = f"the grid of {len(settings)} settings stopped at sample {len(settings[0].results)}"
            for s in settings:
                if s.record["status"] != "running":
                    continue
                if isinstance(err, Exception):
                    s.record.update(failure(err))
                    s.record["error"] = f"{stopped} (any setting's cause): {s.record['error']}"
                else:
                    s.record.update(status="interrupted", error=f"{stopped}: {type(err).__name__}")
            if isinstance(err, Exception):
                print(f"error: {stopped}: {type(err).__name__}: {err}", file=sys.stderr)
            raise
