"""Kept sets of KVBench's methods against kvpress's presses, on one tiny random Llama and the same prompts.

kvpress pins its own transformers, so the script runs itself a second time under kvpress's interpreter
(``--kvpress-python``, a venv with ``pip install kvpress``): that side saves the weights, the prompts
and, per press, the positions each (layer, KV head) keeps after the prefill (kvpress gathers the kept
rows, found again by their keys and values, by values alone for KeyRerotation; ``DMSPress``,
``AdaKVPress`` and unstructured ``KVComposePress`` mask, their ``masked_key_indices`` are read).
KVBench's side prefills the same weights and prompts with the matching method and prints, per method,
how many (prompt, layer, head) sets are identical and their Jaccard index; for ``key_rerotation`` also
the largest difference between kvpress's re-rotated keys (turned forward to KVBench's positions) and
ours, for ``kvcompose`` between kvpress's stored composite tokens (keys and values, per head in
position order) and ours.

``--real``: the embedded SmolLM2-135M-Instruct instead (its weights exported once as safetensors for
kvpress's side) on real prompts, every layer and KV head: two XSum articles (the first, and the longest
of the first 20) and RULER's niah_single_2 at 4K and vt at 2K (the compressed piece of sample 0, as
kvpress's pipeline cuts it; ``KVBENCH_DATA_DIR``).

Usage::

    python scripts/kvpress_kept_sets.py --kvpress-python /path/to/kvpress-venv/bin/python
    python scripts/kvpress_kept_sets.py --kvpress-python /path/to/kvpress-venv/bin/python --real
    KVPRESS_CASES=tova,knorm python scripts/kvpress_kept_sets.py --kvpress-python ...   # some cases only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

N, VOCAB, LAYERS, KV_HEADS = 200, 256, 2, 2
#: Cases whose kvpress press masks keys (``masked_key_indices``) instead of gathering the kept rows.
ADAKV = ("adakv_snapkv_avg", "adakv_snapkv_kvpress")
MASKING = (
    "dms",
    "dms_knorm",
    *ADAKV,
    "kvzip",
    "kvzip_kvpress",
    "kvgrad",
    "kvgrad_kvpress",
    "kvcompose_unstructured",
)
#: The tiny model's chat template (KVzip reads its head and tail; kvpress from ``name_or_path``).
TINY_TEMPLATE = (
    "{{ '<sys>be brief</sys>' }}{% for m in messages %}{{ '<u>' + m['content'] + '</u>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<a>' }}{% endif %}"
)
#: LagKV's partition: kvpress's 128 on the real prompts, 16 on the tiny model's 200 tokens (under 2 x 128
#: kvpress scores nothing); set by each side before it builds its cases.
LAG = {"size": 16}
#: FinchPress's window: the last tokens, after a delimiter its hook removes (an id the prompt lacks)
FINCH_WINDOW = 24
#: Cases whose kvpress press merges values (``MergingPress``): kept rows found by their keys alone, and
#: their values compared as well.
MERGING = ("merging", "merging_snapkv")


def tiny_llama(attn: str):
    """The random GQA Llama of the tests (6 query heads on 2 KV heads, weights x 4), vocabulary 256."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=96, intermediate_size=192, num_hidden_layers=LAYERS,
        num_attention_heads=6, num_key_value_heads=KV_HEADS, max_position_embeddings=1024,
        eos_token_id=2, attn_implementation=attn,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model


def tiny_tokenizer(folder: Path):
    """A byte-level tokenizer (ids 0-255: the tiny vocabulary) with :data:`TINY_TEMPLATE`, saved in
    ``folder`` on first use, loaded from it after."""
    from transformers import AutoTokenizer

    if not (folder / "tokenizer.json").exists():
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
        tok = Tokenizer(models.BPE(vocab, []))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=TINY_TEMPLATE)
        fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def kvpress_cases() -> dict:
    """kvpress's side: name -> (press, attention implementation); compression ratio 0.5."""
    import kvpress as kp

    snap = lambda: kp.SnapKVPress(compression_ratio=0.5)  # noqa: E731  (window 64, kernel 5)
    cases = {
        "observed_attention": (kp.ObservedAttentionPress(compression_ratio=0.5), "eager"),
        "chunkkv": (kp.ChunkKVPress(press=snap(), chunk_length=20), "sdpa"),
        "chunkkv_knorm": (
            kp.ChunkKVPress(press=kp.KnormPress(compression_ratio=0.5), chunk_length=20),
            "sdpa",
        ),
        "leverage_score": (kp.LeverageScorePress(compression_ratio=0.5), "sdpa"),
        "leverage_score_s8": (kp.LeverageScorePress(compression_ratio=0.5, sketch_dimension=8), "sdpa"),
        "leverage_score_s8_global": (
            kp.LeverageScorePress(compression_ratio=0.5, sketch_dimension=8),
            "sdpa",
        ),
        "cur": (kp.CURPress(compression_ratio=0.5), "sdpa"),
        "cur_kv_avg": (kp.CURPress(compression_ratio=0.5, leverage_type="kv_avg"), "sdpa"),
        "key_rerotation": (kp.KeyRerotationPress(press=snap()), "sdpa"),
        "dms_knorm": (kp.DMSPress(press=kp.KnormPress(), threshold=-12.3, sliding_window_size=64), "sdpa"),
        "dms": (kp.DMSPress(press=kp.SnapKVPress(), threshold=0.005, sliding_window_size=100), "sdpa"),
    }
    cases["simlayerkv"] = (kp.SimLayerKVPress(lazy_threshold=0.3, n_recent=64, n_initial=4), "sdpa")
    for name in ADAKV:  # AdaKV masks (masked_key_indices); both KVBench presets against it
        cases[name] = (kp.AdaKVPress(press=snap()), "sdpa")
    cases["snapkv_avg"] = (snap(), "sdpa")
    cases["tova"] = (kp.TOVAPress(compression_ratio=0.5), "eager")
    cases["knorm"] = (kp.KnormPress(compression_ratio=0.5), "sdpa")
    cases["streamingllm_no_rerotate"] = (kp.StreamingLLMPress(compression_ratio=0.5), "sdpa")
    cases["pyramidkv"] = (kp.PyramidKVPress(compression_ratio=0.5), "sdpa")
    cases["pyramidkv_kvpress"] = cases["pyramidkv"]
    cases["chunkkv_kvpress"] = cases["chunkkv"]
    cases["lagkv"] = (kp.LagKVPress(compression_ratio=0.5, lag_size=LAG["size"]), "sdpa")
    cases["lagkv_kvpress"] = cases["lagkv"]
    cases["kvzip"] = (kp.KVzipPress(compression_ratio=0.5), "sdpa")
    cases["kvzip_kvpress"] = cases["kvzip"]
    cases["kvgrad"] = (kp.KVgradPress(compression_ratio=0.5), "sdpa")
    cases["kvgrad_kvpress"] = cases["kvgrad"]
    cases["non_causal_attn"] = (kp.NonCausalAttnPress(compression_ratio=0.5, chunk_size=64), "sdpa")
    cases["compactor"] = (kp.CompactorPress(compression_ratio=0.5, chunk_size=64), "sdpa")
    cases["cap"] = (kp.CapPress(compression_ratio=0.5), "sdpa")
    cases["block"] = (kp.BlockPress(press=kp.KeyDiffPress(compression_ratio=0.5), block_size=128), "sdpa")
    cases["block_b32"] = (kp.BlockPress(press=kp.KeyDiffPress(compression_ratio=0.5), block_size=32), "sdpa")
    cases["chunk"] = (kp.ChunkPress(press=kp.KnormPress(compression_ratio=0.5)), "sdpa")
    cases["entropy_gated_chunkkv"] = (kp.EntropyGatedChunkKVPress(press=snap()), "sdpa")
    cases["entropy_gated_chunkkv_knorm"] = (kp.EntropyGatedChunkKVPress(press=kp.KnormPress(0.5)), "sdpa")
    for name, chunk in (("finch", None), ("finch_c64", 64)):
        cases[name] = (kp.FinchPress(compression_ratio=0.5, chunk_length=chunk, rerotate_keys=False), "sdpa")
    for name, scorer in (("chunk_c48", kp.KnormPress), ("chunk_keydiff_c48", kp.KeyDiffPress)):
        cases[name] = (kp.ChunkPress(press=scorer(compression_ratio=0.5), chunk_length=48), "sdpa")
    cases["merging"] = (kp.MergingPress(press=kp.KnormPress(compression_ratio=0.5)), "sdpa")
    gated = kp.MergingPress(press=snap(), similarity_threshold=0.2, merge_fraction=0.75)
    cases["merging_snapkv"] = (gated, "sdpa")
    cases["kvcompose"] = (kp.KVComposePress(compression_ratio=0.5), "eager")  # its own second forward
    cases["kvcompose_unstructured"] = (kp.KVComposePress(compression_ratio=0.5, structured=False), "eager")
    return {name: case for name, case in cases.items() if name in selected(cases)}


def selected(cases: dict) -> list[str]:
    """The cases named by ``KVPRESS_CASES`` (comma-separated; both sides read it), else all."""
    import os

    names = os.environ.get("KVPRESS_CASES", "")
    return [n for n in names.split(",") if n] or list(cases)


def kvbench_cases() -> dict:
    """KVBench's side: name -> (method, budget: a share of the prompt, floored as kvpress's
    ``compute_n_kept``, or None for an outcome)."""
    from methods import METHOD_REGISTRY as M

    snap = lambda: M["snapkv"](window_size=64, kernel_size=5, pooling="avg")  # noqa: E731
    cases = {
        "observed_attention": (M["observed_attention"](), 0.5),
        "chunkkv": (M["chunkkv"](scorer=snap(), chunk_length=20), 0.5),
        "chunkkv_knorm": (M["chunkkv"](scorer=M["knorm"](), chunk_length=20), 0.5),
        "leverage_score": (M["leverage_score"](), 0.5),  # a sketch wider than head_dim 16: exact leverage
        "leverage_score_s8": (M["leverage_score"](sketch_dimension=8), 0.5),  # the sketches differ (seeds)
        "leverage_score_s8_global": (M["leverage_score"](sketch_dimension=8, seed=None), 0.5),  # kvpress's
        "cur": (M["cur"](), 0.5),
        "cur_kv_avg": (M["cur"](leverage_type="kv_avg"), 0.5),
        "key_rerotation": (M["key_rerotation"](scorer=snap()), 0.5),
        "dms_knorm": (M["dms"](scorer=M["knorm"](), threshold=-12.3, sliding_window_size=64), None),
        "dms": (M["dms"](scorer=snap(), threshold=0.005, sliding_window_size=100), None),
    }
    lazy_layer_0 = M["simlayerkv"](lazy_threshold=0.3, n_recent=64, n_initial=4)
    cases["simlayerkv"] = (lazy_layer_0, None)
    cases["adakv_snapkv_avg"] = (M["adakv"](scorer=snap()), 0.5)  # the paper's safeguard
    cases["adakv_snapkv_kvpress"] = (M["adakv"](scorer=snap(), safeguard_protected=True), 0.5)
    cases["snapkv_avg"] = (snap(), 0.5)
    cases["tova"] = (M["tova"](), 0.5)
    cases["knorm"] = (M["knorm"](), 0.5)
    cases["streamingllm_no_rerotate"] = (M["streamingllm"](rerotate=False), 0.5)
    cases["pyramidkv"] = (M["pyramidkv"](scorer=snap()), 0.5)  # documented: the budget outside the window
    cases["pyramidkv_kvpress"] = (M["pyramidkv"](scorer=snap(), window_in_budget=True), 0.5)
    cases["chunkkv_kvpress"] = (M["chunkkv"](scorer=snap(), chunk_length=20, whole_chunks=True), 0.5)
    cases["lagkv"] = (M["lagkv"](lag_size=LAG["size"]), 0.5)  # documented: rank ties keep the newer partition
    cases["lagkv_kvpress"] = (M["lagkv"](lag_size=LAG["size"], ties="topk"), 0.5)
    cases["kvzip"] = (M["kvzip"](), 0.5)  # documented: the template head kept, heads x B kept per layer
    cases["kvzip_kvpress"] = (M["kvzip"](keep_head=False, count_pairs=True), 0.5)
    cases["kvgrad"] = (M["kvgrad"](), 0.5)  # KVzip's documented choices
    cases["kvgrad_kvpress"] = (M["kvgrad"](keep_head=False, count_pairs=True), 0.5)
    cases["non_causal_attn"] = (M["non_causal_attn"](chunk_size=64), 0.5)  # a partial last chunk
    # kvpress's sketch draw (seed None) and blending (its ratio; ours by default 1 - keep / prompt)
    cases["compactor"] = (M["compactor"](chunk_size=64, blending=0.5, seed=None), 0.5)
    cases["cap"] = (M["cap"](), 0.5)
    cases["block"] = (M["block"](), 0.5)
    cases["block_b32"] = (M["block"](block_size=32), 0.5)
    cases["chunk"] = (M["chunk"](), 0.5)
    cases["finch"] = (M["finch"](window_size=FINCH_WINDOW), 0.5)
    cases["finch_c64"] = (M["finch"](window_size=FINCH_WINDOW, chunk_length=64), 0.5)
    cases["entropy_gated_chunkkv"] = (M["entropy_gated_chunkkv"](scorer=snap()), 0.5)
    cases["entropy_gated_chunkkv_knorm"] = (M["entropy_gated_chunkkv"](scorer=M["knorm"]()), 0.5)
    cases["chunk_c48"] = (M["chunk"](chunk_length=48), 0.5)
    cases["chunk_keydiff_c48"] = (M["chunk"](scorer=M["keydiff"](), chunk_length=48), 0.5)
    cases["merging"] = (M["merging"](), 0.5)
    gated = M["merging"](scorer=snap(), similarity_threshold=0.2, merge_fraction=0.75)
    cases["merging_snapkv"] = (gated, 0.5)
    cases["kvcompose"] = (M["kvcompose"](), 0.5)
    cases["kvcompose_unstructured"] = (M["kvcompose"](structured=False), 0.5)
    return {name: case for name, case in cases.items() if name in selected(cases)}


def kvpress_side(out: Path) -> None:
    """kvpress's kept positions under ``out``: on the tiny model (its weights and prompts saved there
    first), or on the real model and prompts KVBench's side exported there (``out/model``)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    real = (out / "model").is_dir()
    LAG["size"] = 128 if real else 16
    if real:
        load = AutoModelForCausalLM.from_pretrained
        models = {attn: load(out / "model", attn_implementation=attn).eval() for attn in ("sdpa", "eager")}
        prompts = torch.load(out / "prompts.pt")
    else:
        models = {attn: tiny_llama(attn) for attn in ("sdpa", "eager")}
        tiny_tokenizer(out / "tokenizer")
        for model in models.values():  # where KVzipPress loads its tokenizer from
            model.config.name_or_path = str(out / "tokenizer")
        torch.save(models["sdpa"].state_dict(), out / "weights.pt")
        seeds = [torch.Generator().manual_seed(s) for s in range(3)]
        prompts = [torch.randperm(VOCAB, generator=g)[:N][None] for g in seeds]
        torch.save(prompts, out / "prompts.pt")  # distinct tokens: every value row is distinct
    layers, kv_heads = models["sdpa"].config.num_hidden_layers, models["sdpa"].config.num_key_value_heads
    result: dict[str, list] = {}
    merged: dict[str, list] = {}  # MERGING: kept values [kv_heads, k, head_dim] per prompt and layer
    for name, (press, attn) in kvpress_cases().items():
        model, result[name], merged[name] = models[attn], [], []
        for p, ids in enumerate(prompts):
            n = ids.shape[1]
            full, cache = DynamicCache(), DynamicCache()
            with torch.no_grad():
                model(ids, past_key_values=full)
                torch.manual_seed(p)  # the global generator's draws (LeverageScore's sketch) as KVBench's
                fed = ids
                if name.startswith("finch"):  # the delimiter before the window (removed by the press)
                    press.delimiter_token_id = next(t for t in range(VOCAB) if t not in set(ids[0].tolist()))
                    fed = torch.cat([ids[:, : n - FINCH_WINDOW], torch.tensor([[press.delimiter_token_id]]),
                                     ids[:, n - FINCH_WINDOW :]], dim=1)  # fmt: skip
                with press(model):
                    model(fed, past_key_values=cache)
            kept, keys, values = [], [], []
            merged[name].append([])
            for i in range(layers):
                masked = getattr(model.model.layers[i].self_attn, "masked_key_indices", None)
                if name in MASKING:
                    _, head, pos = masked if masked is not None else ([], torch.zeros(0), torch.zeros(0))
                    dropped = [set(pos[head == h].tolist()) for h in range(kv_heads)]
                    kept.append([sorted(set(range(n)) - d) for d in dropped])
                    continue
                rows, every = cache.layers[i].values[0], full.layers[i].values[0]
                if name in MERGING:  # merged values: the keys alone find the rows
                    rows, every = cache.layers[i].keys[0], full.layers[i].keys[0]
                elif (
                    name != "key_rerotation"
                ):  # rotated keys tell repeated tokens apart (layer 0's values not)
                    rows = torch.cat([cache.layers[i].keys[0], rows], dim=-1)
                    every = torch.cat([full.layers[i].keys[0], every], dim=-1)
                exact = "donot_use_mm_for_euclid_dist"
                dist = [torch.cdist(rows[h], every[h], compute_mode=exact) for h in range(kv_heads)]
                kept.append([sorted(d.argmin(-1).tolist()) for d in dist])
                if name in MERGING:  # the kept values in position order
                    order = [d.argmin(-1).argsort() for d in dist]
                    merged[name][-1].append(
                        torch.stack([cache.layers[i].values[0, h, o] for h, o in enumerate(order)])
                    )
                keys.append(cache.layers[i].keys[0].tolist())
                if name == "kvcompose":  # the composite tokens' rows, compared with KVBench's stored ones
                    values.append(cache.layers[i].values[0].tolist())
            result[name].append({"kept": kept, "keys": keys, "values": values})
    (out / "kvpress.json").write_text(json.dumps(result))
    torch.save({name: v for name, v in merged.items() if name in MERGING}, out / "merged_values.pt")


def real_model():
    """The embedded model (``configs/model/smollm2-135m.yaml``) and its tokenizer, KVBench's loader."""
    from omegaconf import OmegaConf

    from runners.models.loading import load_model, load_tokenizer

    cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "model" / "smollm2-135m.yaml")
    return load_model(cfg), load_tokenizer(cfg)


def real_prompts(tokenizer) -> list[torch.Tensor]:
    """``[1, n]`` ids of the real prompts (module docstring), read from ``KVBENCH_DATA_DIR``."""
    import os

    from tasks.ruler import Ruler

    data = Path(os.environ.get("KVBENCH_DATA_DIR", "data"))
    articles = [json.loads(line)["document"] for line in (data / "xsum" / "test.jsonl").open()][:20]
    ids = [tokenizer(a, return_tensors="pt").input_ids for a in articles]
    prompts = [ids[0], max(ids, key=lambda t: t.shape[1])]
    for task, length in (("niah_single_2", 4096), ("vt", 2048)):
        ruler = Ruler(data_dir=str(data), tasks=[task], lengths=[length], limit=1)
        sample = ruler.load(tokenizer)[0]
        full = ruler.encode(tokenizer, sample)
        prompts.append(full[:, : ruler.chunk_start(tokenizer, sample, full)])
    return prompts


def kvbench_side(out: Path, real: bool = False) -> None:
    """Run KVBench's methods on kvpress's weights and prompts; print the agreement per method."""
    from transformers.models.llama.modeling_llama import rotate_half

    import methods  # noqa: F401  (registers the "kvbench" attention implementation)
    from runners.generation.greedy import greedy_generate
    from runners.setup.budget import resolve_budget

    LAG["size"] = 128 if real else 16
    if real:
        model, tokenizer = real_model()
    else:
        model, tokenizer = tiny_llama("kvbench"), tiny_tokenizer(out / "tokenizer")
        model.load_state_dict(torch.load(out / "weights.pt"))
    kv_heads = model.config.num_key_value_heads
    prompts, theirs = torch.load(out / "prompts.pt"), json.loads((out / "kvpress.json").read_text())
    merged = torch.load(out / "merged_values.pt")
    for name, (method, share) in kvbench_cases().items():
        if hasattr(method, "attach_tokenizer"):  # KVzip's reconstruction prompt (kvpress: no thinking)
            method.attach_tokenizer(tokenizer, {"enable_thinking": False})
        jaccard, key_diff, held = [], 0.0, []
        jaccard, key_diff, held, value_diff = [], 0.0, [], 0.0
        for p, ids in enumerate(prompts):
            seen: list = []
            n = ids.shape[1]
            budget = resolve_budget(share, n)  # floored as kvpress's compute_n_kept; keeps the share
            torch.manual_seed(p)  # the global generator as on kvpress's side
            greedy_generate(model, ids, method, budget, 1, set(), lambda c, seen=seen: seen or seen.append(c))
            for i, layer in enumerate(seen[0].layers):
                for h in range(kv_heads):
                    pos = layer.store.positions[0, h]
                    ours, ref = {q for q in pos.tolist() if 0 <= q < n}, set(theirs[name][p]["kept"][i][h])
                    jaccard.append(len(ours & ref) / len(ours | ref))
                    held.append(len(ours) / n)
                    if name in MERGING and ours == ref:  # the merged values, in position order
                        slots = [s for s in pos.argsort().tolist() if 0 <= pos[s] < n]
                        diff = (layer.values[0, h, slots].float() - merged[name][p][i][h].float()).abs().max()
                        value_diff = max(value_diff, float(diff))
                    if name == "key_rerotation" and ours == ref:  # kvpress: 0 .. k-1; KVBench: n-k .. n-1
                        k, slots = len(ref), [s for s in pos.argsort().tolist() if 0 <= pos[s] < n]
                        kv = torch.tensor(theirs[name][p]["keys"][i][h])
                        cos, sin = model.model.rotary_emb(kv[None], torch.full((1, k), n - k))
                        turned = kv * cos[0] + rotate_half(kv) * sin[0]
                        key_diff = max(key_diff, float((turned - layer.keys[0, h, slots]).abs().max()))
                    if name == "kvcompose" and ours == ref:  # kvpress's rows in position order, as ours
                        slots = [s for s in pos.argsort().tolist() if 0 <= pos[s] < n]
                        kv = [torch.tensor(theirs[name][p][f][i][h]) for f in ("keys", "values")]
                        rows = [layer.keys[0, h, slots], layer.values[0, h, slots]]
                        key_diff = max(
                            key_diff, *(float((a - b).abs().max()) for a, b in zip(kv, rows, strict=True))
                        )
        if not jaccard:
            continue
        same = sum(j == 1.0 for j in jaccard)
        extra = f"; re-rotated keys: max |diff| {key_diff:.1e}" if name == "key_rerotation" else ""
        extra += f"; merged values: max |diff| {value_diff:.1e}" if name in MERGING else ""
        extra = f"; stored keys, values: max |diff| {key_diff:.1e}" if name == "kvcompose" else extra
        print(
            f"{name:20s} identical {same}/{len(jaccard)}  Jaccard mean {sum(jaccard) / len(jaccard):.3f} "
            f"min {min(jaccard):.3f}  kept {sum(held) / len(held):.2f}{extra}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvpress-python", help="python of a venv with kvpress installed")
    parser.add_argument("--real", action="store_true", help="the embedded model on real prompts")
    parser.add_argument("--kvpress-side", type=Path, help=argparse.SUPPRESS)  # the re-run under kvpress
    args = parser.parse_args()
    if args.kvpress_side is not None:
        kvpress_side(args.kvpress_side)
        return
    if not args.kvpress_python:
        parser.error("--kvpress-python is required")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:  # KVBench's loader reads the GGUF; kvpress's side reads these weights
            model, tokenizer = real_model()
            model.config.attn_implementation = "sdpa"
            model.save_pretrained(Path(tmp) / "model")
            tokenizer.save_pretrained(Path(tmp) / "model")  # KVzipPress loads it from name_or_path
            torch.save(real_prompts(tokenizer), Path(tmp) / "prompts.pt")
            del model
        subprocess.run([args.kvpress_python, __file__, "--kvpress-side", tmp], check=True)
        kvbench_side(Path(tmp), args.real)


if __name__ == "__main__":
    main()
