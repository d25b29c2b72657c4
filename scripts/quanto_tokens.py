"""``quant=quanto_int<b>`` against transformers' own ``QuantizedCache`` on the embedded model: greedy texts.

For the first ``--prompts`` XSum samples (chat protocol, ``KVBENCH_DATA_DIR``) and each (nbits, residual
length) asked for, the embedded SmolLM2-135M-Instruct generates ``--new`` tokens greedily twice:
``method=fullkv quant=quanto_int<b>`` through KVBench's seam, and ``model.generate(...,
cache_implementation="quantized", cache_config={"backend": "quanto", "nbits": b, "q_group_size": 64,
"residual_length": R})`` with stock SDPA attention. Prints, per setting, how many of the texts are
identical, and where the first different character is for the others. ``--contrast`` adds
``quant=int4`` (per-token codes without the residual) against the R = 1 reference (it differs: no residual).

Usage::

    KVBENCH_DATA_DIR=/path/to/data python scripts/quanto_tokens.py            # nbits 4, R 1 and 128
    KVBENCH_DATA_DIR=... python scripts/quanto_tokens.py --bits 2 4 --residual 1 128 --contrast
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from methods import FullKV  # noqa: E402
from methods.quant import storage_kind  # noqa: E402
from methods.quant.quanto import QuantoStore  # noqa: E402
from runners.generation.greedy import eos_token_ids, greedy_generate  # noqa: E402
from runners.models.loading import load_model, load_tokenizer  # noqa: E402
from tasks.xsum import XSum  # noqa: E402


def first_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def reference(model, ids: torch.Tensor, new: int, bits: int, residual: int) -> list[int]:
    """transformers' greedy tokens with its quanto ``QuantizedCache`` (SDPA attention)."""
    config = {"backend": "quanto", "nbits": bits, "q_group_size": 64, "residual_length": residual}
    model.set_attn_implementation("sdpa")
    try:
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            do_sample=False,
            cache_implementation="quantized",
            cache_config=config,
        )
    finally:
        model.set_attn_implementation("kvbench")
    return out[0, ids.shape[1] :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--bits", type=int, nargs="+", default=[4])
    parser.add_argument("--residual", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--contrast", action="store_true", help="also quant=int4 against the R = 1 reference")
    args = parser.parse_args()

    cfg = OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml")
    model, tokenizer = load_model(cfg), load_tokenizer(cfg)
    task = XSum(data_dir=os.environ.get("KVBENCH_DATA_DIR"), limit=args.prompts)
    samples = task.load(tokenizer)
    prompts = [(s.id, task.encode(tokenizer, s)) for s in samples]
    eos = eos_token_ids(model, tokenizer)
    text = partial(tokenizer.decode, skip_special_tokens=True)

    def ours(ids: torch.Tensor, storage) -> list[int]:
        return greedy_generate(model, ids, FullKV(), None, args.new, eos, storage=storage).tokens

    settings = [(b, r) for b in args.bits for r in args.residual]
    if args.contrast:
        settings.append((4, 1, "int4"))
    print(f"{len(prompts)} XSum prompts ({min(i.shape[1] for _, i in prompts)}-"
          f"{max(i.shape[1] for _, i in prompts)} tokens), greedy, {args.new} new tokens")  # fmt: skip
    for setting in settings:
        bits, residual = setting[:2]
        name = setting[2] if len(setting) > 2 else f"quanto_int{bits}"
        storage = (
            storage_kind("int4", {"bits": 4, "group": 64})
            if name == "int4"
            else partial(QuantoStore, bits=bits, group=64, residual=residual)
        )
        same, notes = 0, []
        for sid, ids in prompts:
            a, b = text(ours(ids, storage)), text(reference(model, ids, args.new, bits, residual))
            same += a == b
            if a != b:
                notes.append(f"{sid}@{first_difference(a, b)}")
        label = f"quant={name} vs QuantizedCache(quanto, nbits={bits}, residual_length={residual})"
        where = f" (first different character: {', '.join(notes)})" if notes else ""
        print(f"{label}: {same} of {len(prompts)} texts identical{where}", flush=True)


if __name__ == "__main__":
    main()
