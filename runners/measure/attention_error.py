"""Attention-error analysis (``runner=error``): ZSMerge Figure 4 for any method.

Along FullKV's greedy decoding of real prompts (the configured task's samples), one compressed
*shadow* cache per budget receives exactly the keys, values and queries of the FullKV run at
every layer (``kvbench_observer`` of ``methods.seam.attention``); at each decode step the shadow's
attention output ``o_c`` is compared with FullKV's ``o``: relative error ``||o_c - o||_F / ||o||_F``
over heads and dimensions. Errors therefore measure the cache approximation of each layer alone
(no propagation through later layers), which is what "merging vs eviction" is about; they are
averaged over steps and samples, per layer and over layers.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from methods import CompressedCache, CompressionMethod, FullKV
from methods.seam.architecture import LayerSpec, layer_specs
from methods.seam.step import decode_step, prefill_step
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.generation.greedy import eos_token_ids, greedy_generate
from runners.models.loading import load_model
from runners.output.record import new_record, recording, run_config, stored_run
from runners.setup.budget import resolve_budget
from runners.setup.build import build_components, load_prompts, refuse_untrained
from runners.setup.quant_kind import storage_of
from runners.setup.settings import RunSettings, at_budget
from tasks.errors import KVBenchError


class ShadowCaches:
    """Compressed caches (one per budget) driven by a FullKV run, accumulating relative errors.

    Parameters
    ----------
    method : CompressionMethod
        The method under analysis.
    budgets : list[int]
        Slot budgets (tokens per layer and KV head), resolved for the current prompt.
    specs : list[LayerSpec]
        The model's decoder layers (``methods.seam.architecture.layer_specs``).
    storage : StorageKind
        The run's storage kind (the FullKV reference holds the same).

    Attributes
    ----------
    error_sum, steps : torch.Tensor
        ``[budgets, layers]`` float64 sums of relative errors and their counts (decode steps).
    """

    def __init__(
        self,
        method: CompressionMethod,
        budgets: list[int],
        specs: list[LayerSpec],
        storage: StorageKind = SlotStore,
    ) -> None:
        self.method = method
        num_layers = len(specs)
        self.caches = [CompressedCache(method, b, specs, storage=storage) for b in budgets]
        self.error_sum = torch.zeros((len(budgets), num_layers), dtype=torch.float64)
        self.steps = torch.zeros((len(budgets), num_layers), dtype=torch.float64)

    def __call__(
        self,
        layer_idx: int,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        out: torch.Tensor,
        scale: float,
    ) -> None:
        """Feed one layer's call to every shadow (shapes as ``methods.seam.attention``)."""
        reference = out.float()
        norm = reference.norm()
        for i, cache in enumerate(self.caches):
            layer = cache.layers[layer_idx]
            layer.update(keys, values)
            if layer.plan is None:
                prefill_step(cache.rules[layer_idx], layer, query, None, None, scale)  # uncompressed output
                continue
            approx = decode_step(cache.rules[layer_idx], layer, query, scale)
            self.error_sum[i, layer_idx] += float((approx.float() - reference).norm() / norm)
            self.steps[i, layer_idx] += 1


def run_attention_error(settings: RunSettings) -> dict:
    """Relative attention-output error of one method vs FullKV at each of ``runner.budgets``.

    Raises
    ------
    KVBenchError
        For bad input (budgets, method, task, data), before the model is loaded.
    """
    refuse_untrained(settings)
    budgets = list(settings.runner.budgets)
    if not budgets:
        raise KVBenchError("runner.budgets is empty")
    for b in budgets:
        build_components(at_budget(settings, b))  # validates each budget with the method's assets
    method, task = build_components(settings)
    storage = storage_of(settings, method)
    if not method.traits.compresses:
        raise KVBenchError(
            "runner=error compares a compressing method with FullKV; method=fullkv has no error"
        )
    if method.traits.probes:
        raise KVBenchError(
            f"runner=error drives its caches with FullKV's forwards; {method.label} scores with forwards "
            "of its own after the prefill: run it with runner=quality"
        )
    if not task.query_aware:
        raise KVBenchError(
            "runner=error compresses whole prompts; run it with task.query_aware=true "
            f"(task {task.name} is set query-agnostic)"
        )
    config = run_config(settings.config, method.traits.budget_applies)
    tokenizer, samples, prompts = load_prompts(settings.model, task)
    store, rid, done = stored_run(settings.config, config, print_error_table, samples)
    if done is not None:
        return done
    new, context = settings.runner.decode_tokens, settings.model.max_context
    if (longest := max(p.shape[1] for p in prompts)) + new > context:
        raise KVBenchError(
            f"a prompt of {longest} tokens + {new} decode tokens exceeds {settings.model.name}'s context"
        )
    model = load_model(settings.model, settings.device)
    record = new_record(rid, config, method.label, task.name, model.device, data_source=task.source,
                        n_samples=len(samples), budgets=budgets)  # fmt: skip
    specs = layer_specs(model)
    layers = len(specs)
    error_sum = torch.zeros((len(budgets), layers), dtype=torch.float64)
    steps = torch.zeros_like(error_sum)
    with recording(settings.config, store, record):
        for ids in tqdm(prompts, desc=f"error {method.label}", disable=not settings.runner.progress):
            slots = [resolve_budget(b, ids.shape[1], context, settings.budget_unit) for b in budgets]
            shadows = ShadowCaches(method, slots, specs, storage)
            greedy_generate(
                model, ids, FullKV(), None, new, eos_token_ids(model, tokenizer), observer=shadows,
                storage=storage,
            )  # fmt: skip
            error_sum += shadows.error_sum
            steps += shadows.steps
        per_layer = (error_sum / steps.clamp(min=1)).tolist()
        mean = [sum(row) / len(row) for row in per_layer]
        record.update(
            status="ok",
            metrics={f"rel_error@{b}": m for b, m in zip(budgets, mean, strict=True)},
            error_analysis={"budgets": budgets, "mean": mean, "per_layer": per_layer,
                            "decode_steps": steps[0].tolist()},
        )  # fmt: skip
    print_error_table(record)
    return record


def print_error_table(record: dict) -> None:
    """Budget -> mean relative error (and the worst layer) of one error record."""
    analysis = record.get("error_analysis")
    if not analysis:
        print(f"{record.get('method')}: status {record['status']} {record.get('error') or ''}")
        return
    print(f"relative attention-output error vs FullKV: {record['method']} on {record['task']}")
    for b, m, layer in zip(analysis["budgets"], analysis["mean"], analysis["per_layer"], strict=True):
        worst = max(range(len(layer)), key=layer.__getitem__)
        print(f"  budget {b}: mean {m:.3e}  (worst layer {worst}: {layer[worst]:.3e})")
