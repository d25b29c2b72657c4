"""CaM's generated tokens against kvpress's ``CAMPress`` through kvpress's own pipeline (greedy).

The embedded SmolLM2-135M-Instruct (float32; its weights exported once as safetensors for kvpress's
side) on the first ``--n`` XSum articles (``KVBENCH_DATA_DIR``). kvpress's side, run under its own
interpreter (``--kvpress-python``), builds each prompt with its pipeline (the article as context, a
one-line instruction as question, the chat template split between them), seeds torch's global
generator with the prompt's index and generates with ``CAMPress(base_press=KnormPress(), ...)``; it
saves the context and question ids, the budget ``target_size`` (``--share`` of the prompt, floored) and
the generated ids. KVBench's side prefills context + question at once (its CaM counts the prompt's last
query as the step kvpress's question pass is), seeds the global generator alike and generates with
``cam`` (``seed=null``: the same Bernoulli draws, in the same layer order). It prints, per prompt,
whether the generated texts are identical and the first differing token, then k of n (and, as a
control, k of n with other draws on KVBench's side: what the merges change).

Usage::

    KVBENCH_DATA_DIR=/path/to/data python scripts/kvpress_cam_tokens.py \\
        --kvpress-python /path/to/kvpress-venv/bin/python [--n 5 --new 48 --interval 1 --share 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kvpress_driver as driver  # the embedded model's export and the re-run under kvpress

QUESTION = "Summarize the article above in one sentence."


def kvpress_side(out: Path, args: argparse.Namespace) -> None:
    """kvpress's pipeline on the exported model and articles; ids saved to ``out/kvpress.json``."""
    from kvpress import CAMPress, KnormPress
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained(
        out / "model", dtype=torch.float32, attn_implementation="sdpa"
    )
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    pipe = pipeline("kv-press-text-generation", model=model.eval(), tokenizer=tokenizer)
    articles = json.loads((out / "articles.json").read_text())
    result = []
    for p, article in enumerate(articles):
        ids = pipe.preprocess(article, [QUESTION], "", int(1e10))
        context, question = ids["context_ids"], ids["questions_ids"][0]
        target = int((context.shape[1] + question.shape[1]) * args.share)
        press = CAMPress(
            base_press=KnormPress(),
            compression_interval=args.interval,
            target_size=target,
            merge_budget=args.merge_budget,
        )
        seen: list[list[int]] = []  # the generated ids, as the pipeline hands them to decode
        decode = tokenizer.decode

        def record(t, decode=decode, seen=seen, **kw):
            seen.append(t.tolist())
            return decode(t, **kw)

        tokenizer.decode = record
        torch.manual_seed(p)  # the Bernoulli draws: the global generator, as on KVBench's side
        with torch.no_grad():
            text = pipe(article, question=QUESTION, press=press, max_new_tokens=args.new)["answer"]
        tokenizer.decode = decode
        result.append(
            {"context": context[0].tolist(), "question": question[0].tolist(), "target": target}
            | {"tokens": seen[-1], "text": text}
        )
    (out / "kvpress.json").write_text(json.dumps(result))


def kvbench_side(out: Path, model, tokenizer, args: argparse.Namespace) -> None:
    """KVBench's ``cam`` on the same ids; prints the comparison."""
    from methods import CAM, KNorm
    from runners.generation.greedy import greedy_generate

    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    same = other = 0
    theirs = json.loads((out / "kvpress.json").read_text())
    for p, ref in enumerate(theirs):
        ids = torch.tensor([ref["context"] + ref["question"]])
        method = CAM(
            scorer=KNorm(), compression_interval=args.interval, merge_budget=args.merge_budget, seed=None
        )
        torch.manual_seed(p)
        ours = greedy_generate(model, ids, method, ref["target"], args.new, eos).tokens
        text = tokenizer.decode(ours, skip_special_tokens=True)
        first = next((i for i, (a, b) in enumerate(zip(ours, ref["tokens"], strict=False)) if a != b), None)
        if first is None and len(ours) != len(ref["tokens"]):
            first = min(len(ours), len(ref["tokens"]))
        same += text == ref["text"]
        torch.manual_seed(p + 1000)  # a control: other Bernoulli draws than kvpress's
        other += greedy_generate(model, ids, method, ref["target"], args.new, eos).tokens == ref["tokens"]
        where = "identical" if first is None else f"first differing token {first}"
        head = f"prompt {p}: {ids.shape[1]} tokens, target {ref['target']}, {len(ours)} new"
        print(f"{head}: {where}", flush=True)
        if first is not None:
            print(f"  kvpress: {ref['text']!r}\n  kvbench: {text!r}")
    setting = f"interval {args.interval}, merge_budget {args.merge_budget}, share {args.share}"
    print(f"identical texts: {same} of {len(theirs)} ({setting}); with other draws: {other} of {len(theirs)}")


def main() -> None:
    parser = driver.parser(__doc__, real=False)
    parser.add_argument("--n", type=int, default=5, help="XSum articles (the first n)")
    parser.add_argument("--new", type=int, default=48, help="new tokens at most")
    parser.add_argument("--interval", type=int, default=1, help="compression_interval")
    parser.add_argument("--merge-budget", type=int, default=32, help="merge_budget")
    parser.add_argument("--share", type=float, default=0.5, help="target_size as a share of the prompt")
    args = parser.parse_args()
    if args.kvpress_side is not None:
        kvpress_side(args.kvpress_side, args)
        return
    if not args.kvpress_python:
        parser.error("--kvpress-python is required")
    sys.path.insert(0, str(driver.REPO))
    model, tokenizer = driver.real_model()
    data = Path(os.environ.get("KVBENCH_DATA_DIR", "data"))
    rows = [json.loads(line)["document"] for line in (data / "xsum" / "test.jsonl").open()][: args.n]
    with tempfile.TemporaryDirectory() as tmp:
        driver.export_model(model, tokenizer, Path(tmp) / "model")
        (Path(tmp) / "articles.json").write_text(json.dumps(rows))
        flags = [f"--{k}={getattr(args, k)}" for k in ("n", "new", "interval")]
        flags += [f"--merge-budget={args.merge_budget}", f"--share={args.share}"]
        driver.rerun(args, __file__, tmp, *flags)
        del model
        model, _ = driver.real_model()  # KVBench's loader again (the export changed the attention)
        kvbench_side(Path(tmp), model, tokenizer, args)


if __name__ == "__main__":
    main()
