"""KVgrad (``methods.kvgrad``, kvpress ``KVgradPress``) against a reference with transformers' own
autograd: KVzip's selection over attention x value x gradient scores."""

from __future__ import annotations

import torch

from runners.generation.model_run import ModelRun
from tests.conftest import tiny_llama
from tests.kvzip_reference import (
    BUDGET,
    CHUNK,
    PROMPT,
    RESUME,
    SINKS,
    TEMPLATE,
    kept_positions,
    prompt_ids,
    reference_kept,
    reference_kvgrad_scores,
    reference_scores,
)


def test_kvgrad_keeps_the_best_attention_x_value_x_gradient():
    """KVgrad: the kept sets of KVzip's selection over :func:`reference_kvgrad_scores`, which are not
    those of KVzip's own scores; the heads freed."""
    from methods import KVgrad

    ours, reference = tiny_llama(layers=3), tiny_llama(layers=3)
    reference.set_attn_implementation("sdpa")
    ids = prompt_ids()
    method = KVgrad(n_sink=SINKS, chunk_size=CHUNK, resume_tokens=RESUME, prompt=TEMPLATE)
    run = ModelRun(ours, method, BUDGET, PROMPT)
    with torch.inference_mode():
        run.prefill(ids)
    kept = kept_positions(run.cache)
    assert kept == reference_kept(reference_kvgrad_scores(reference, ids), False)
    assert kept != reference_kept(reference_scores(reference, ids), False)
    assert run.cache.kv_bytes() == sum(len(h) for layer in kept for h in layer) * 2 * 16 * 4
