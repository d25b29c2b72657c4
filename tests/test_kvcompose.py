"""KVCompose (``methods.kvcompose``) against a plain statement of kvpress's ``KVComposePress`` rule: the
prompt read a second time through transformers' own cache and eager attention, the scores, composite
tokens and counts in Python loops and sorted lists."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from methods import KVCompose
from runners.generation.model_run import ModelRun
from runners.setup.budget import resolve_budget
from tests.conftest import tiny_llama

LAYERS, HEADS, GROUP, PROMPT, SHARE = 3, 2, 3, 61, 0.5  # an odd prompt: int(layers x 61 x 0.5) = 91


def prompt_ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@torch.no_grad()
def reference_kept(model, ids: torch.Tensor, opts: dict) -> list[list[set[int]]]:
    """Per layer and KV head, the positions kvpress's rule keeps (``kvcompose_press.py``): the prompt is
    fed again after itself; a query head scores token j by the max (mean) over those queries of their
    attention to j; a KV head by the mean (max) over its group; times ``||v_j||``; plus the layer's mean
    over KV heads. Structured: the i-th composite of a layer scores the mean (max) of its heads' i-th
    best scores (the first ``lower`` + 1e9), layer 0's the max over layers; the best ``int(layers x n x
    share)`` composites give the counts (at least ``max(1, lower)``); each head keeps its best tokens.
    Unstructured: every head's sorted scores ranked over all layers and heads."""
    n = ids.shape[1]
    cache = DynamicCache(config=model.config)
    model(ids, past_key_values=cache, use_cache=True)
    values = [cache.layers[i].values[0, :, :n].clone() for i in range(LAYERS)]
    seen = model(ids, past_key_values=cache, use_cache=True, output_attentions=True).attentions
    pick = {"max": max, "mean": mean}
    scores = []  # [layer][kv head][token]
    for i in range(LAYERS):
        att = seen[i][0]  # [q_heads, n queries, 2n keys]
        task = [
            [pick[opts["agg_task"]](att[h, :, j].tolist()) for j in range(n)] for h in range(HEADS * GROUP)
        ]
        layer = []
        for g in range(HEADS):
            heads = task[g * GROUP : (g + 1) * GROUP]
            s = [pick[opts["agg_group"]]([row[j] for row in heads]) for j in range(n)]
            if opts["add_v_norm"]:
                s = [s[j] * float(values[i][g, j].norm()) for j in range(n)]
            layer.append(s)
        if opts["add_mean_across_heads"]:
            layer = [[s[j] + mean([other[j] for other in layer]) for j in range(n)] for s in layer]
        scores.append(layer)
    lower = opts["keep_token_lower_bound"]
    ranked = [[sorted(s, reverse=True) for s in layer] for layer in scores]
    if opts["structured"]:
        comp = [
            [pick[opts["agg_head"]]([r[j] for r in layer]) + (1e9 if j < lower else 0) for j in range(n)]
            for layer in ranked
        ]
        comp[0] = [max(c[j] for c in comp) for j in range(n)]
        units = [(c, i) for i, layer in enumerate(comp) for c in layer]
        top = sorted(units, reverse=True)[: int(LAYERS * n * SHARE)]
        counts = [[max(1, lower, sum(1 for _, i in top if i == lay))] * HEADS for lay in range(LAYERS)]
    else:
        units = [
            (c + (1e9 if j < lower else 0), i, h)
            for i, layer in enumerate(ranked)
            for h, r in enumerate(layer)
            for j, c in enumerate(r)
        ]
        top = sorted(units, reverse=True)[: int(LAYERS * HEADS * n * SHARE)]
        counts = [
            [max(1, sum(1 for _, i, g in top if (i, g) == (lay, h))) for h in range(HEADS)]
            for lay in range(LAYERS)
        ]
    return [
        [set(sorted(range(n), key=lambda j, s=s: -s[j])[:c]) for s, c in zip(layer, cs, strict=True)]
        for layer, cs in zip(scores, counts, strict=True)
    ]


def kept_positions(cache, row: int = 0) -> list[list[set[int]]]:
    return [[set(p[p >= 0].tolist()) for p in layer.store.positions[row]] for layer in cache.layers]


DEFAULTS = {
    "structured": True,
    "agg_task": "max",
    "agg_group": "mean",
    "agg_head": "mean",
    "add_v_norm": False,
    "add_mean_across_heads": True,
    "keep_token_lower_bound": 0,
}
OTHERS = {"agg_task": "mean", "agg_group": "max", "agg_head": "max", "add_v_norm": True}


@pytest.mark.parametrize(
    "opts",
    [
        DEFAULTS,
        {**DEFAULTS, "structured": False},
        {**DEFAULTS, **OTHERS, "add_mean_across_heads": False, "keep_token_lower_bound": 12},
        {**DEFAULTS, **OTHERS, "structured": False, "keep_token_lower_bound": 3},
    ],
    ids=["structured", "unstructured", "structured_options", "unstructured_options"],
)
def test_kept_sets_are_kvpress_rule_and_the_memory_is_freed(opts):
    ours, reference = tiny_llama(layers=LAYERS), tiny_llama(layers=LAYERS)
    reference.set_attn_implementation("eager")
    ids = prompt_ids()
    run = ModelRun(ours, KVCompose(**opts), resolve_budget(SHARE, PROMPT), PROMPT)
    with torch.inference_mode():
        run.prefill(ids)
    kept = kept_positions(run.cache)
    assert kept == reference_kept(reference, ids, opts)
    per_head = [[len(head) for head in layer] for layer in kept]
    assert len({sum(layer) for layer in per_head}) > 1  # the layers share the budget unequally
    if opts["structured"]:  # composites: one count per layer, positions per head
        assert all(len(set(layer)) == 1 for layer in per_head) and any(a != b for a, b in kept)
    else:
        assert len({c for layer in per_head for c in layer}) > LAYERS
    slots = sum(c for layer in per_head for c in layer)
    assert run.cache.kv_bytes() == slots * 2 * 16 * 4  # K and V (head_dim 16, fp32) of the kept tokens


@pytest.mark.parametrize("structured", [True, False])
def test_batch_rows_are_compressed_as_alone(structured):
    model, ids = tiny_llama(layers=LAYERS), torch.cat([prompt_ids(1), prompt_ids(2)])
    runs = [
        ModelRun(model, KVCompose(structured=structured), resolve_budget(SHARE, PROMPT), PROMPT) for _ in "ab"
    ]
    with torch.inference_mode():
        runs[0].prefill(ids)
        runs[1].prefill(ids[1:])
    assert kept_positions(runs[0].cache, 1) == kept_positions(runs[1].cache)
    assert kept_positions(runs[0].cache, 0) != kept_positions(runs[0].cache, 1)


@pytest.mark.parametrize(
    "bad", [{"agg_task": "sum"}, {"agg_group": "min"}, {"agg_head": ""}, {"keep_token_lower_bound": -1}]
)
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        KVCompose(**bad)
