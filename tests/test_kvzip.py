"""KVzip (``methods.kvzip``) against its paper's rule, and the probe forwards it runs after the prefill
(``runners.generation.probe``): they see the prompt as the model's own cache holds it and leave the cache as
it is."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

from methods import FullKV
from methods.kvzip import KVzip
from methods.kvzip_prompt import ReconstructionPrompt
from methods.probing import Probe
from runners.generation.model_run import ModelRun, model_forward
from runners.generation.probe import ProbeCache
from tests.architectures import tiny_family
from tests.conftest import REPO, tiny_llama
from tests.kvzip_reference import (
    BUDGET,
    CHUNK,
    PROMPT,
    RESUME,
    SINKS,
    TEMPLATE,
    kept_positions,
    kvpress_kept,
    prompt_ids,
    reference_kept,
    reference_scores,
)


@pytest.mark.parametrize(
    "layerwise, plus",
    [(True, False), (False, False), (False, True)],
    ids=["layerwise", "across_layers", "plus"],
)
def test_kept_sets_are_the_papers_rule_and_the_heads_share_the_budget(layerwise, plus):
    ours, reference = tiny_llama(layers=3), tiny_llama(layers=3)
    reference.set_attn_implementation("sdpa")
    if plus:  # RMSNorm weights that differ by channel: tokens' attention inputs of different norms
        for model in (ours, reference):
            for i, layer in enumerate(model.model.layers):
                weight = torch.rand(96, generator=torch.Generator().manual_seed(i)) * 8
                layer.input_layernorm.weight.data.copy_(weight)
    ids = prompt_ids()
    method = KVzip(
        n_sink=SINKS, layerwise=layerwise, chunk_size=CHUNK, resume_tokens=RESUME, prompt=TEMPLATE,
        kvzip_plus_normalization=plus,
    )  # fmt: skip
    run = ModelRun(ours, method, BUDGET, PROMPT)
    with torch.inference_mode():
        run.prefill(ids)
    kept = kept_positions(run.cache)
    assert kept == reference_kept(reference_scores(reference, ids, plus), layerwise)
    if plus:  # the weights change what is kept
        assert kept != reference_kept(reference_scores(reference, ids), layerwise)
    per_layer = [sum(len(head) for head in layer) for layer in kept]
    heads = [len(head) for layer in kept for head in layer]
    if layerwise:  # each layer holds heads x B, the heads unequal
        assert per_layer == [2 * BUDGET] * 3 and len(set(heads)) > 1
    else:  # all layers together hold layers x heads x B, the layers unequal
        assert sum(per_layer) == 3 * 2 * BUDGET and len(set(per_layer)) > 1
    assert (
        run.cache.kv_bytes() == sum(heads) * 2 * 16 * 4
    )  # freed: K and V (head_dim 16, fp32) of the kept pairs


@pytest.mark.parametrize("layerwise", [True, False], ids=["layerwise", "across_layers"])
def test_kvzip_kvpress_evicts_the_template_head_and_int_ratio_x_pairs(layerwise):
    """``keep_head=false, count_pairs=true`` (preset ``kvzip_kvpress``): kvpress's kept sets at a share
    (0.35 of 70 tokens) where ``int(ratio x pairs)`` evicted is not ``heads x B`` kept (147 pairs kept
    of 420, not 144), the head token after the sinks evicted, and the default keeps others."""
    from methods.seam.plan import Slots

    ours, reference = tiny_llama(layers=3), tiny_llama(layers=3)
    reference.set_attn_implementation("sdpa")
    ids, budget = prompt_ids(), Slots(int(PROMPT * 0.35), 0.35)
    want = kvpress_kept(reference_scores(reference, ids), 0.65, layerwise)
    kept = {}
    for preset in (True, False):
        method = KVzip(
            n_sink=SINKS, layerwise=layerwise, chunk_size=CHUNK, resume_tokens=RESUME, prompt=TEMPLATE,
            keep_head=not preset, count_pairs=preset,
        )  # fmt: skip
        run = ModelRun(ours, method, budget, PROMPT)
        with torch.inference_mode():
            run.prefill(ids)
        kept[preset] = kept_positions(run.cache)
    assert kept[True] == want and kept[False] != want
    assert all(SINKS not in head for layer in want for head in layer)  # the head's last token
    assert sum(len(head) for layer in want for head in layer) == 3 * 2 * 70 - int(3 * 2 * 70 * 0.65)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
@torch.inference_mode()
def test_a_probe_forward_is_the_models_own_and_leaves_the_cache(family):
    """The chunk's logits are those of the prompt + chunk fed to the model (Gemma-2: sliding layers,
    soft-capping), and the prefilled cache is unchanged."""
    model = tiny_family(family)
    ids = torch.randint(3, 128, (1, 48), generator=torch.Generator().manual_seed(1))
    whole = ModelRun(model, FullKV(), None, 48).prefill(ids)
    run = ModelRun(model, FullKV(), None, 48)
    run.prefill(ids[:, :36])
    before = [(layer.store.n_slots, layer.get_seq_length(), layer.keys.clone()) for layer in run.cache.layers]
    probes = ProbeCache(run.cache)
    probes.probe = Probe(ids[:, 36:], (0, 36))
    positions = torch.arange(36, 48)[None]
    torch.testing.assert_close(
        model_forward(model, ids[:, 36:], positions, probes), whole, atol=1e-4, rtol=1e-4
    )
    for (n, seen, keys), layer in zip(before, run.cache.layers, strict=True):
        assert (layer.store.n_slots, layer.get_seq_length()) == (n, seen) and torch.equal(layer.keys, keys)


def test_the_template_head_is_found_in_a_ruler_prompt(tokenizer):
    """The reconstruction prompt's head is the start of a chat-template prompt as the tasks build it
    (``tasks.chat.pipeline_pieces``), so the system prompt is kept and the context alone repeated."""
    from tasks.chat import pipeline_pieces, template_kwargs

    kwargs = template_kwargs(tokenizer, None)
    pieces = ReconstructionPrompt.from_tokenizer(tokenizer, kwargs)
    first, _, special = pipeline_pieces(tokenizer, "Some haystack text.", "\nWhat is it?", "Answer:", kwargs)
    ids = tokenizer(first, add_special_tokens=special)["input_ids"]
    assert len(pieces.head) > 1 and tuple(ids[: len(pieces.head)]) == pieces.head
    probes = KVzip(prompt=pieces).probe_prompts(torch.tensor([ids]))
    assert [p.span for p in probes] == [(len(pieces.head), len(ids))]
    assert tokenizer.decode(probes[0].ids[0]).startswith("\n\nRepeat the previous context exactly.<|im_end|>")


def test_the_runners_give_kvzip_the_tokenizers_prompt(tokenizer):
    from runners.setup.build import build_method
    from runners.setup.settings import read_settings

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["method=kvzip_layerwise"])
    method = build_method(read_settings(cfg))
    assert method.layerwise and method.prompt == ReconstructionPrompt.from_tokenizer(tokenizer, {})


def test_a_kvzip_without_its_prompt_says_so():
    with pytest.raises(ValueError, match="attach_tokenizer"):
        KVzip().probe_prompts(prompt_ids())
