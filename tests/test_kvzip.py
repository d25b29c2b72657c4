"""KVzip (``methods.kvzip``) against its paper's rule, and the probe forwards it runs after the prefill
(``runners.generation.probe``): they see the prompt as the model's own cache holds it and leave the cache as
it is."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import rotate_half

from methods import FullKV
from methods.kvzip import KVzip
from methods.kvzip_prompt import ReconstructionPrompt
from methods.probing import Probe
from runners.generation.model_run import ModelRun, model_forward
from runners.generation.probe import ProbeCache
from tests.architectures import tiny_family
from tests.conftest import REPO, tiny_llama

PROMPT, BUDGET, SINKS, CHUNK, RESUME = 70, 24, 2, 20, 3
TEMPLATE = ReconstructionPrompt(head=(1, 2, 3), repeat=(5, 6, 7, 8), resume=(5, 6, 7, 9), tail=(10, 11))


def prompt_ids(seed: int = 0) -> torch.Tensor:
    ids = torch.randint(12, 128, (1, PROMPT), generator=torch.Generator().manual_seed(seed))
    ids[0, : len(TEMPLATE.head)] = torch.tensor(TEMPLATE.head)  # a prompt in the chat template
    return ids


@torch.no_grad()
def reference_scores(model, ids: torch.Tensor, plus: bool = False) -> torch.Tensor:
    """Sec. 3.2 with transformers' own cache and attention: the context (after the template head) is
    repeated in chunks against the prefilled cache, and a pair scores the largest attention a repeat
    query of its group gives it, the softmax over the sinks, the chunk's context and the repeat's causal
    part; KVzip+ (``plus``, kvpress ``score_kvzip``): each probability times ``||v W_o^h||_2`` (query
    head ``h``'s columns of ``o_proj``) over ``||h||_2`` of the query's attention input.
    ``[layers, kv_heads, prompt]``, NaN where nothing is scored (the head)."""
    cfg, n, head = model.config, ids.shape[1], len(TEMPLATE.head)
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    model(ids, cache=cache, use_cache=True)
    seen = {}
    hooks = [
        layer.self_attn.register_forward_hook(
            lambda m, a, kw, out: seen.__setitem__(
                m.layer_idx, (kw["hidden_states"], kw["position_embeddings"])
            ),
            with_kwargs=True,
        )
        for layer in model.model.layers
    ]
    scores = torch.full((cfg.num_hidden_layers, hkv, n), float("nan"))
    spans = [(a, min(a + CHUNK, n)) for a in range(head, n, CHUNK)]
    for i, (a, b) in enumerate(spans):
        ask = list(TEMPLATE.repeat) if i == 0 else [*TEMPLATE.resume, *ids[0, a - RESUME : a].tolist()]
        chunk = torch.tensor([[*ask, *TEMPLATE.tail, *ids[0, a:b].tolist()]])
        model(chunk, cache=cache, use_cache=True)  # positions n, n + 1, ... (the cache's length)
        m = chunk.shape[1]
        for layer, module in enumerate(model.model.layers):
            hidden, (cos, sin) = seen[layer]
            q = module.self_attn.q_proj(hidden).view(1, m, hq, d).transpose(1, 2)
            q = q * cos[:, None] + rotate_half(q) * sin[:, None]
            keys = cache.layers[layer].keys[0]  # [kv_heads, n + m, head_dim]
            for h in range(hq):
                k = torch.cat(
                    [
                        keys[h // (hq // hkv), : min(SINKS, a)],
                        keys[h // (hq // hkv), a:b],
                        keys[h // (hq // hkv), n:],
                    ]
                )
                logits = q[0, h] @ k.T / d**0.5
                logits[:, k.shape[0] - m :] += torch.full((m, m), float("-inf")).triu(1)
                best = logits.softmax(-1)[:, min(SINKS, a) : min(SINKS, a) + b - a]
                if plus:
                    values = cache.layers[layer].values[0][h // (hq // hkv), a:b]
                    out = values @ module.self_attn.o_proj.weight[:, h * d : (h + 1) * d].T
                    best = best * out.norm(dim=-1) / hidden[0].norm(dim=-1)[:, None]
                best = best.amax(0)
                old = scores[layer, h // (hq // hkv), a:b]
                scores[layer, h // (hq // hkv), a:b] = torch.where(
                    old.isnan(), best, torch.maximum(old, best)
                )
        cache.crop(-m)  # the chunk leaves the cache
    for hook in hooks:
        hook.remove()
    return scores


def reference_kept(scores: torch.Tensor, layerwise: bool) -> list[list[set[int]]]:
    """Per layer and KV head, the kept positions: the first ``max(sinks, head)`` tokens, then the highest
    scores, ``heads x BUDGET`` per layer (``layerwise``) or ``layers x heads x BUDGET`` over all layers."""
    layers, heads, n = scores.shape
    first = max(SINKS, len(TEMPLATE.head))
    kept = [[set(range(first)) for _ in range(heads)] for _ in range(layers)]
    pools = [range(layers)] if not layerwise else [[layer] for layer in range(layers)]
    for pool in pools:
        pairs = [
            (float(scores[l_, h, p]), l_, h, p) for l_ in pool for h in range(heads) for p in range(first, n)
        ]
        for _, l_, h, p in sorted(pairs, reverse=True)[: len(pool) * heads * (BUDGET - first)]:
            kept[l_][h].add(p)
    return kept


def kept_positions(cache) -> list[list[set[int]]]:
    return [[set(row[row >= 0].tolist()) for row in layer.store.positions[0]] for layer in cache.layers]


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


def kvpress_kept(scores: torch.Tensor, ratio: float, layerwise: bool) -> list[list[set[int]]]:
    """kvpress ``KVzipPress.compress_post``: the unscored template head at 0, the sinks above every
    score, and the ``int(ratio x pairs)`` lowest evicted, of all layers' pairs or (``layerwise``) of
    each layer's."""
    s = scores.nan_to_num(0.0)
    s[..., :SINKS] = s.max() + 1
    layers, heads, n = s.shape
    kept = [[set(range(n)) for _ in range(heads)] for _ in range(layers)]
    for pool in [[layer] for layer in range(layers)] if layerwise else [range(layers)]:
        pairs = sorted((float(s[l_, h, p]), l_, h, p) for l_ in pool for h in range(heads) for p in range(n))
        for _, l_, h, p in pairs[: int(len(pairs) * ratio)]:
            kept[l_][h].discard(p)
    return kept


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


def reference_kvgrad_scores(model, ids: torch.Tensor) -> torch.Tensor:
    """KVgrad (kvpress ``KVgradPress``) with transformers' own cache, attention and autograd: each
    chunk of :func:`reference_scores` fed as embeddings that require a gradient, ``Phi`` the sum of
    squares of the last decoder layer's outputs, its gradient at each attention module's output (kept
    by hooks); a pair scores ``max`` over its group's query heads ``h`` and the chunk's tokens ``p`` of
    ``A_hp ||v W_o^h||_2 ||d Phi / d o_p||_2``. ``[layers, kv_heads, prompt]``, NaN for the head."""
    cfg, n, head = model.config, ids.shape[1], len(TEMPLATE.head)
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    seen, outs, last = {}, {}, []

    def attention_hook(m, a, kw, out):
        seen[m.layer_idx] = (kw["hidden_states"].detach(), kw["position_embeddings"])
        outs[m.layer_idx] = out[0]

    hooks = [
        layer.self_attn.register_forward_hook(attention_hook, with_kwargs=True)
        for layer in model.model.layers
    ]
    hooks.append(model.model.layers[-1].register_forward_hook(lambda m, a, out: last.append(out)))
    scores = torch.full((cfg.num_hidden_layers, hkv, n), float("nan"))
    for i, a in enumerate(range(head, n, CHUNK)):
        b = min(a + CHUNK, n)
        ask = list(TEMPLATE.repeat) if i == 0 else [*TEMPLATE.resume, *ids[0, a - RESUME : a].tolist()]
        chunk = torch.tensor([[*ask, *TEMPLATE.tail, *ids[0, a:b].tolist()]])
        embeds = model.model.embed_tokens(chunk).detach().requires_grad_(True)
        model.model(inputs_embeds=embeds, cache=cache, use_cache=True)
        m = chunk.shape[1]
        layers = range(cfg.num_hidden_layers)
        grads = torch.autograd.grad(last[-1].square().sum(), [outs[layer] for layer in layers])
        with torch.no_grad():
            for layer, module in enumerate(model.model.layers):
                hidden, (cos, sin) = seen[layer]
                q = module.self_attn.q_proj(hidden).view(1, m, hq, d).transpose(1, 2)
                q = q * cos[:, None] + rotate_half(q) * sin[:, None]
                keys, values = cache.layers[layer].keys[0], cache.layers[layer].values[0]
                for h in range(hq):
                    g = h // (hq // hkv)
                    k = torch.cat([keys[g, : min(SINKS, a)], keys[g, a:b], keys[g, n:]])
                    logits = q[0, h] @ k.T / d**0.5
                    logits[:, k.shape[0] - m :] += torch.full((m, m), float("-inf")).triu(1)
                    probs = logits.softmax(-1)[:, min(SINKS, a) : min(SINKS, a) + b - a]
                    out = values[g, a:b] @ module.self_attn.o_proj.weight[:, h * d : (h + 1) * d].T
                    best = (probs * out.norm(dim=-1) * grads[layer][0].norm(dim=-1)[:, None]).amax(0)
                    old = scores[layer, g, a:b]
                    scores[layer, g, a:b] = torch.where(old.isnan(), best, torch.maximum(old, best))
        cache.crop(-m)  # the chunk leaves the cache
    for hook in hooks:
        hook.remove()
    return scores


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
