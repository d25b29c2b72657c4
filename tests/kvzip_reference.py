"""References for KVzip and KVgrad written with transformers' own cache, attention and autograd (not
with ``methods``): the scores of the paper's reconstruction probes (Sec. 3.2), kvpress's kept sets, and
the prompt and template the tests share."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import rotate_half

from methods.kvzip_prompt import ReconstructionPrompt

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
