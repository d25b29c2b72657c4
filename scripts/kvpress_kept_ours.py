"""KVBench's side of ``scripts/kvpress_kept_sets.py``: per case of ``kvpress_kept_cases.py``, KVBench's method
prefills kvpress's weights and prompts; the positions its store holds per (prompt, layer, KV head) are
compared with those kvpress's side wrote (``kvpress.json``).

Prints per case the identical sets over the total, their Jaccard index (mean, min) and the share kept;
for ``key_rerotation`` also the largest difference between kvpress's re-rotated keys (turned forward to
KVBench's positions) and ours, for ``kvcompose`` between kvpress's stored composite tokens (keys and
values, per head in position order) and ours, for MERGING between the merged values.

Debug (``KVPRESS_SCORES``, ``kvpress_kept_theirs.py``): per differing head, the tokens each side alone
keeps and, per side, the scores (ours / kvpress's) of its last kept and first dropped token (``score``
order; ours: ``prefill_scores``, or ``kvpress_scores`` where the method has it).
"""

from __future__ import annotations

from pathlib import Path

import torch
from kvpress_driver import agreement, jaccard_index, kvbench_inputs, prefill
from kvpress_kept_cases import MERGING, kvbench_cases, use_lag


def rerotated_key_diff(model, kv: torch.Tensor, ours: torch.Tensor, n: int) -> float:
    """The largest ``|diff|`` between kvpress's kept keys ``kv`` ``[k, head_dim]`` (re-rotated to positions
    0 .. k-1), turned forward to KVBench's positions n-k .. n-1, and ``ours`` ``[k, head_dim]``."""
    from transformers.models.llama.modeling_llama import rotate_half

    k = ours.shape[0]
    cos, sin = model.model.rotary_emb(kv[None], torch.full((1, k), n - k))
    turned = kv * cos[0] + rotate_half(kv) * sin[0]
    return float((turned - ours).abs().max())


def record_scores(method, sink: dict) -> None:
    """Make the method's score (``kvpress_scores`` where it has it, else ``prefill_scores``) also store
    its ``[kv_heads, n]`` result in ``sink[layer_idx]`` (debug)."""
    fn = "kvpress_scores" if hasattr(method, "kvpress_scores") else "prefill_scores"
    score = getattr(type(method), fn).__get__(method)

    def recorded(layer, *args):
        out = score(layer, *args)
        sink[layer.spec.layer_idx] = out[0].float().clone()
        return out

    object.__setattr__(method, fn, recorded)


def explain(where: str, ours: set, ref: set, mine: torch.Tensor, kv: torch.Tensor) -> None:
    """Print a differing head's tokens and, per side, the scores (ours / kvpress's) at its cut (debug)."""
    print(f"  {where}: only ours {sorted(ours - ref)}, only kvpress {sorted(ref - ours)}")
    for side, s, kept in (("ours", mine, ours), ("kvpress", kv, ref)):
        last = min(kept, key=lambda t: (float(s[t]), t))
        first = max(set(range(len(s))) - kept, key=lambda t: (float(s[t]), -t))
        for label, t in (("last kept", last), ("first dropped", first)):
            print(f"    {side} {label} {t}: {float(mine[t])!r} / {float(kv[t])!r}")
    gap = float((mine - kv).abs().max())
    print(f"    |score| max {float(kv.abs().max()):.3g}; max |ours - kvpress| {gap:.2e}")


def kvbench_side(out: Path, real: bool = False) -> None:
    """Run KVBench's methods on kvpress's weights and prompts; print the agreement per method."""
    import methods  # noqa: F401  (registers the "kvbench" attention implementation)
    from runners.setup.budget import resolve_budget

    use_lag(real)
    model, tokenizer, prompts, theirs = kvbench_inputs(out, real)
    kv_heads = model.config.num_key_value_heads
    merged = torch.load(out / "merged_values.pt")
    scores = torch.load(out / "scores.pt")
    for name, (method, share) in kvbench_cases().items():
        mine: dict = {}
        if name in scores:
            record_scores(method, mine)
        if hasattr(method, "attach_tokenizer"):  # KVzip's reconstruction prompt (kvpress: no thinking)
            method.attach_tokenizer(tokenizer, {"enable_thinking": False})
        jaccard, key_diff, held, value_diff = [], 0.0, [], 0.0
        for p, ids in enumerate(prompts):
            n = ids.shape[1]
            budget = resolve_budget(share, n)  # floored as kvpress's compute_n_kept; keeps the share
            torch.manual_seed(p)  # the global generator as on kvpress's side
            for i, layer in enumerate(prefill(model, ids, method, budget).layers):
                for h in range(kv_heads):
                    pos = layer.store.positions[0, h]
                    ours, ref = {q for q in pos.tolist() if 0 <= q < n}, set(theirs[name][p]["kept"][i][h])
                    jaccard.append(jaccard_index(ours, ref))
                    held.append(len(ours) / n)
                    if ours != ref and name in scores:
                        kv = scores[name][p][i][h]
                        explain(f"prompt {p} layer {i} head {h}", ours, ref, mine[i][h], kv)
                    if ours != ref:
                        continue
                    slots = [s for s in pos.argsort().tolist() if 0 <= pos[s] < n]  # in position order
                    if name in MERGING:  # the merged values
                        diff = (layer.values[0, h, slots].float() - merged[name][p][i][h].float()).abs().max()
                        value_diff = max(value_diff, float(diff))
                    if name == "key_rerotation":  # kvpress: 0 .. k-1; KVBench: n-k .. n-1
                        kv = torch.tensor(theirs[name][p]["keys"][i][h])
                        key_diff = max(key_diff, rerotated_key_diff(model, kv, layer.keys[0, h, slots], n))
                    if name == "kvcompose":  # kvpress's rows in position order, as ours
                        kv = [torch.tensor(theirs[name][p][f][i][h]) for f in ("keys", "values")]
                        rows = [layer.keys[0, h, slots], layer.values[0, h, slots]]
                        key_diff = max(
                            key_diff, *(float((a - b).abs().max()) for a, b in zip(kv, rows, strict=True))
                        )
        if not jaccard:
            continue
        extra = f"; re-rotated keys: max |diff| {key_diff:.1e}" if name == "key_rerotation" else ""
        extra += f"; merged values: max |diff| {value_diff:.1e}" if name in MERGING else ""
        extra = f"; stored keys, values: max |diff| {key_diff:.1e}" if name == "kvcompose" else extra
        print(f"{agreement(name, jaccard, 20)}  kept {sum(held) / len(held):.2f}{extra}")
