"""KVzip's kept sets against kvpress's ``KVzipPress`` on the same model and context, and its
compression time against one prefill.

The context is a RULER prompt up to its question (the leaderboard's query-agnostic protocol) in the
embedded model's chat template. KVBench's ``method=kvzip`` (``--layerwise``; ``--plus``: KVzip+)
compresses it here; the same ids then go to ``KVzipPress`` in kvpress's own virtual environment
(``--venv``: it pins its own transformers), which this script calls with ``--kvpress`` (nothing of
KVBench imported there). kvpress masks instead of evicting: its kept set is the complement of
``masked_key_indices``. Printed per layer: the Jaccard index of the kept ``(head, position)`` pairs over
the whole context and over the context after the chat template's head (what both score), and the largest
difference of the reconstruction scores there. Timing: the median over ``--repeats`` of FullKV's prefill
of the context and of KVzip's (prefill, reconstruction forwards, compression), alternating.

    python scripts/kvzip_vs_kvpress.py --length 4096 --ratio 0.5
    python scripts/kvzip_vs_kvpress.py --layerwise --timing 0
    python scripts/kvzip_vs_kvpress.py --plus --timing 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
VENV = REPO.parent / "kvpress-venv" / "bin" / "python"


def kvpress_side(inputs: Path, output: Path) -> None:
    """In kvpress's venv: ``KVzipPress`` on the saved ids; saves its kept masks and scores."""
    from kvpress import KVzipPress
    from transformers import AutoModelForCausalLM, DynamicCache

    job = torch.load(inputs)
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)  # sdpa
    press = KVzipPress(
        compression_ratio=job["ratio"], layerwise=job["layerwise"], n_sink=job["n_sink"],
        kvzip_plus_normalization=job["plus"],
    )  # fmt: skip
    scores, post = {}, press.compress_post

    def spy(model):  # the scores before the sinks are raised (compress_post resets them after)
        scores["val"], scores["prefix"] = press.score_val.clone(), press.prefix_length
        post(model)

    press.compress_post = spy
    with torch.no_grad(), press(model):
        model(input_ids=job["ids"], past_key_values=DynamicCache(config=model.config), use_cache=True)
    layers, n = len(model.model.layers), job["ids"].shape[1]
    kept = torch.ones(layers, model.config.num_key_value_heads, n, dtype=torch.bool)
    for i, layer in enumerate(model.model.layers):
        _, heads, positions = layer.self_attn.masked_key_indices
        kept[i, heads, positions] = False
    torch.save({"kept": kept, "scores": scores["val"][:, 0], "prefix": scores["prefix"]}, output)


def context_ids(args) -> tuple[object, torch.Tensor]:
    """The run config and the RULER sample's context ``[1, context]`` (up to its question)."""
    from hydra import compose, initialize_config_dir

    from runners.setup.build import build_components, load_prompts
    from runners.setup.settings import read_settings

    overrides = [f"method={'kvzip_plus' if args.plus else 'kvzip'}", f"method.layerwise={args.layerwise}"]
    overrides += ["task=ruler"]
    overrides += [f"task.tasks=[{args.task}]", f"task.lengths=[{args.length}]", "task.limit=1"]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"compression_ratio={args.ratio}"])
    settings = read_settings(cfg)
    _, task = build_components(settings)
    tokenizer, samples, prompts = load_prompts(settings.model, task)
    return settings, prompts[0][:, : task.chunk_start(tokenizer, samples[0], prompts[0])]


def kept_mask(run, n: int) -> torch.Tensor:
    """``[layers, kv_heads, n]`` bool: the positions each head of a compressed run holds."""
    out = []
    for layer in run.cache.layers:
        pos = layer.store.positions[0]
        mask = torch.zeros(pos.shape[0], n, dtype=torch.bool)
        heads = torch.arange(pos.shape[0])[:, None].expand_as(pos)
        mask[heads[pos >= 0], pos[pos >= 0].long()] = True  # ragged heads' padding at -1
        out.append(mask)
    return torch.stack(out)


def our_rule(scores: torch.Tensor, head: int, budget: int, layerwise: bool) -> torch.Tensor:
    """``[layers, kv_heads, n]`` kept mask of KVBench's rule applied to ``scores`` (kvpress's): the
    template head kept, then the top ``layers x heads x budget`` (``layerwise``: per layer)."""
    from methods.kvzip import top_mask

    ranked = scores.clone()
    ranked[..., :head] = torch.inf
    if layerwise:
        return top_mask(ranked, ranked.shape[1] * budget)
    return top_mask(ranked[None].flatten(1, 2), ranked[..., 0].numel() * budget).view(ranked.shape)


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a & b).sum() / (a | b).sum())


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--kvpress", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--task", default="niah_single_1")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--ratio", type=float, default=0.5, help="kvpress's compression_ratio")
    parser.add_argument("--layerwise", action="store_true")
    parser.add_argument("--plus", action="store_true", help="KVzip+ (kvzip_plus_normalization) on both sides")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timing", type=int, default=1, help="0: no timing")
    parser.add_argument("--venv", type=Path, default=VENV, help="python of kvpress's venv")
    args = parser.parse_args()
    if args.kvpress:
        return kvpress_side(*args.kvpress)
    sys.path.insert(0, str(REPO))
    from methods import FullKV
    from runners.generation.greedy import ModelRun
    from runners.models.loading import _source, load_model
    from runners.setup.build import build_method

    settings, ids = context_ids(args)
    method, n = build_method(settings), ids.shape[1]
    budget = n - int(n * args.ratio)  # kvpress's: int(ratio x pairs) masked (a multiple of layers x heads)
    model = load_model(settings.model)
    scores, compress = [], method.compress

    def spy(layers: list) -> None:  # the reconstruction scores, before the layers are compressed
        scores.extend(layer.store.state["scores"][0] for layer in layers)
        compress(layers)

    method.compress = spy
    with torch.inference_mode():
        run = ModelRun(model, method, budget, n)
        run.prefill(ids)
    del method.compress
    ours, ours_scores = kept_mask(run, n), torch.stack(scores)
    with tempfile.TemporaryDirectory() as tmp:
        job = {"ids": ids, "ratio": args.ratio, "layerwise": args.layerwise, "n_sink": method.n_sink}
        job["plus"] = args.plus
        torch.save({**job, "model": str(_source(settings.model))}, Path(tmp) / "in.pt")
        script = [str(args.venv), __file__, "--kvpress", f"{tmp}/in.pt", f"{tmp}/out.pt"]
        subprocess.run(script, check=True, cwd=tmp)
        theirs = torch.load(Path(tmp) / "out.pt")
    head = theirs["prefix"]
    print(f"context {n} tokens (template head {head}, ours {len(method.prompt.head)}), budget {budget}/head")
    print(f"kept pairs: ours {int(ours.sum())}, kvpress {int(theirs['kept'].sum())}")
    ruled = our_rule(theirs["scores"].float(), head, budget, args.layerwise)
    print("layer  jaccard  after_head  kvpress_scores_our_rule  max|score diff|  ours_kept  kvpress_kept")
    for i, (a, b) in enumerate(zip(ours, theirs["kept"], strict=True)):
        diff = float((ours_scores[i, :, head:] - theirs["scores"][i, :, head:]).abs().max())
        after, same = jaccard(a[:, head:], b[:, head:]), jaccard(a, ruled[i])
        row = f"{i:5d}  {jaccard(a, b):7.4f}  {after:10.4f}  {same:23.4f}  {diff:15.2e}"
        print(f"{row}  {int(a.sum()):9d}  {int(b.sum()):12d}")
    whole, after = jaccard(ours, theirs["kept"]), jaccard(ours[..., head:], theirs["kept"][..., head:])
    print(f"all    {whole:7.4f}  {after:10.4f}  {jaccard(ours, ruled):23.4f}")
    if args.timing:
        times = {"fullkv": [], "kvzip": []}
        for _ in range(args.repeats):
            for name, rule in (("fullkv", FullKV()), ("kvzip", method)):
                start = time.perf_counter()
                with torch.inference_mode():
                    ModelRun(model, rule, None if name == "fullkv" else budget, n).prefill(ids)
                times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["kvzip"] / med["fullkv"]
        print(json.dumps({"seconds": times, "median": med, "kvzip_over_prefill": ratio}))


if __name__ == "__main__":
    main()
