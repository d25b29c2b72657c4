"""kvpress's side of ``scripts/kvpress_kept_sets.py``, run under kvpress's interpreter: per case of
``kvpress_kept_cases.py``, the positions each (prompt, layer, KV head) keeps after the prefill.

kvpress gathers the kept rows; they are found again in the uncompressed cache by their keys and values
(by values alone for KeyRerotation, whose keys are turned; by keys alone for MergingPress, whose values
are merged). ``DMSPress``, ``AdaKVPress``, KVzip, KVgrad and unstructured ``KVComposePress`` mask: their
``masked_key_indices`` are read. Writes ``kvpress.json`` (per case and prompt: ``kept`` ``[layer][head]``
positions, ``keys`` ``[layer][head][k][head_dim]`` rows; ``values`` too for ``kvcompose``) and
``merged_values.pt`` (MERGING's kept values ``[kv_heads, k, head_dim]`` per prompt and layer, in
position order).

Debug: ``KVPRESS_SCORES=<cases>`` (comma-separated) also saves those ScorerPress cases' ``score`` per
prompt and layer (``scores.pt``: ``[kv_heads, n]`` float32); KVBench's side then prints, per differing
head, the differing tokens and both sides' scores at the cut.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from kvpress_driver import VOCAB, kvpress_inputs, tiny_tokenizer
from kvpress_kept_cases import FINCH_WINDOW, MASKING, MERGING, kvpress_cases, use_lag


def finch_prompt(press, ids: torch.Tensor) -> torch.Tensor:
    """``ids`` ``[1, n]`` with FinchPress's delimiter (an id the prompt lacks, set on ``press``; its hook
    removes it) before the last :data:`FINCH_WINDOW` tokens."""
    n = ids.shape[1]
    press.delimiter_token_id = next(t for t in range(VOCAB) if t not in set(ids[0].tolist()))
    delimiter = torch.tensor([[press.delimiter_token_id]])
    return torch.cat([ids[:, : n - FINCH_WINDOW], delimiter, ids[:, n - FINCH_WINDOW :]], dim=1)


def record_scores(press, sink: dict) -> None:
    """Make ``press.score`` also store its ``[kv_heads, n]`` result in ``sink[layer_idx]`` (debug)."""
    score = type(press).score

    def recorded(module, *args, **kwargs):
        out = score(press, module, *args, **kwargs)
        sink[module.layer_idx] = out[0].float().clone()
        return out

    object.__setattr__(press, "score", recorded)


def kept_rows(name: str, cache, full, i: int, kv_heads: int) -> tuple[list[list[int]], list]:
    """Layer ``i``'s kept positions per KV head, found by nearest row of the compressed ``cache`` in the
    uncompressed ``full``; with them, for MERGING, the order that sorts the kept rows by position."""
    rows, every = cache.layers[i].values[0], full.layers[i].values[0]
    if name in MERGING:  # merged values: the keys alone find the rows
        rows, every = cache.layers[i].keys[0], full.layers[i].keys[0]
    elif name != "key_rerotation":  # rotated keys tell repeated tokens apart (layer 0's values not)
        rows = torch.cat([cache.layers[i].keys[0], rows], dim=-1)
        every = torch.cat([full.layers[i].keys[0], every], dim=-1)
    exact = "donot_use_mm_for_euclid_dist"
    dist = [torch.cdist(rows[h], every[h], compute_mode=exact) for h in range(kv_heads)]
    return [sorted(d.argmin(-1).tolist()) for d in dist], [d.argmin(-1).argsort() for d in dist]


def kvpress_side(out: Path) -> None:
    """kvpress's kept positions under ``out``: on the tiny model (its weights and prompts saved there
    first), or on the real model and prompts KVBench's side exported there (``out/model``)."""
    from transformers import DynamicCache

    real = (out / "model").is_dir()
    use_lag(real)
    models, prompts = kvpress_inputs(out, ("sdpa", "eager"))
    if not real:
        tiny_tokenizer(out / "tokenizer")
        for model in models.values():  # where KVzipPress loads its tokenizer from
            model.config.name_or_path = str(out / "tokenizer")
    layers, kv_heads = models["sdpa"].config.num_hidden_layers, models["sdpa"].config.num_key_value_heads
    result: dict[str, list] = {}
    merged: dict[str, list] = {}  # MERGING: kept values [kv_heads, k, head_dim] per prompt and layer
    debug, scores = os.environ.get("KVPRESS_SCORES", "").split(","), {}
    for name, (press, attn) in kvpress_cases().items():
        model, result[name], merged[name] = models[attn], [], []
        for p, ids in enumerate(prompts):
            if name in debug:
                scores.setdefault(name, []).append({})
                record_scores(press, scores[name][-1])
            n = ids.shape[1]
            full, cache = DynamicCache(), DynamicCache()
            with torch.no_grad():
                model(ids, past_key_values=full)
                torch.manual_seed(p)  # the global generator's draws (LeverageScore's sketch) as KVBench's
                fed = finch_prompt(press, ids) if name.startswith("finch") else ids
                with press(model):
                    model(fed, past_key_values=cache)
            kept, keys, values = [], [], []
            merged[name].append([])
            for i in range(layers):
                if name in MASKING:
                    masked = getattr(model.model.layers[i].self_attn, "masked_key_indices", None)
                    _, head, pos = masked if masked is not None else ([], torch.zeros(0), torch.zeros(0))
                    dropped = [set(pos[head == h].tolist()) for h in range(kv_heads)]
                    kept.append([sorted(set(range(n)) - d) for d in dropped])
                    continue
                positions, order = kept_rows(name, cache, full, i, kv_heads)
                kept.append(positions)
                if name in MERGING:  # the kept values in position order
                    merged[name][-1].append(
                        torch.stack([cache.layers[i].values[0, h, o] for h, o in enumerate(order)])
                    )
                keys.append(cache.layers[i].keys[0].tolist())
                if name == "kvcompose":  # the composite tokens' rows, compared with KVBench's stored ones
                    values.append(cache.layers[i].values[0].tolist())
            result[name].append({"kept": kept, "keys": keys, "values": values})
    (out / "kvpress.json").write_text(json.dumps(result))
    torch.save({name: v for name, v in merged.items() if name in MERGING}, out / "merged_values.pt")
    torch.save(scores, out / "scores.pt")
