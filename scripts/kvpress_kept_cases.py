"""The cases of ``scripts/kvpress_kept_sets.py``: per name, kvpress's press (:func:`kvpress_cases`, built
under kvpress's interpreter) and KVBench's matching method (:func:`kvbench_cases`); a new case goes in both.

Compression ratio 0.5 throughout; SnapKV as kvpress's (window 64, kernel 5, avg pooling). A name ending in
``_kvpress`` is KVBench's kvpress-exact variant of a method whose default differs for a documented reason
(docs/methods.md). ``KVPRESS_CASES`` (comma-separated names) picks some cases on both sides.
"""

from __future__ import annotations

import os

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
#: Cases whose kvpress press merges values (``MergingPress``): kept rows found by their keys alone, and
#: their values compared as well.
MERGING = ("merging", "merging_snapkv")
#: LagKV's partition: kvpress's 128 on the real prompts, 16 on the tiny model's 200 tokens (under 2 x 128
#: kvpress scores nothing); set by each side (:func:`use_lag`) before it builds its cases.
LAG = {"size": 16}
#: FinchPress's window: the last tokens, after a delimiter its hook removes (an id the prompt lacks)
FINCH_WINDOW = 24


def use_lag(real: bool) -> None:
    """Set LagKV's partition (:data:`LAG`) for the real prompts or the tiny model's."""
    LAG["size"] = 128 if real else 16


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
    """The cases named by ``KVPRESS_CASES`` (comma-separated; both sides read it), else all.

    Raises
    ------
    SystemExit
        ``error: unknown case(s) ...`` (the known ones listed) for a name that is not a case.
    """
    names = [n for n in os.environ.get("KVPRESS_CASES", "").split(",") if n]
    unknown = [n for n in names if n not in cases]
    if unknown:
        raise SystemExit(f"error: unknown KVPRESS_CASES {', '.join(unknown)} (cases: {', '.join(cases)})")
    return names or list(cases)


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
