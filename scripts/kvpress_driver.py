"""The driver the kvpress comparison scripts share (``kvpress_kept_sets.py``, ``kvpress_think_channels.py``,
``kvpress_cam_tokens.py``): the models and prompts, the re-run under kvpress's interpreter and the
agreement line.

kvpress pins its own transformers, so each script runs itself a second time under kvpress's interpreter
(``--kvpress-python``, a venv with ``pip install kvpress``, hidden flag ``--kvpress-side FOLDER``). That
interpreter lacks KVBench's dependencies (omegaconf, hydra): this module imports only the standard
library and torch at its top; KVBench's code (``methods``, ``runners``, ``tasks``) only inside the
functions KVBench's side calls.

The models: the tiny random GQA Llama (2 layers, 6 query heads on 2 KV heads, vocabulary 256, weights
x 4) on three prompts of 200 distinct tokens; or (``--real``) the embedded SmolLM2-135M-Instruct, its
weights exported as safetensors for kvpress's side, on two XSum articles (the first, and the longest of
the first 20) and RULER's niah_single_2 at 4K and vt at 2K (the compressed piece of sample 0, as
kvpress's pipeline cuts it), read from ``KVBENCH_DATA_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
N, VOCAB, LAYERS, KV_HEADS = 200, 256, 2, 2
#: The tiny model's chat template (KVzip reads its head and tail; kvpress from ``name_or_path``).
TINY_TEMPLATE = (
    "{{ '<sys>be brief</sys>' }}{% for m in messages %}{{ '<u>' + m['content'] + '</u>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<a>' }}{% endif %}"
)


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


def real_model():
    """The embedded model (``configs/model/smollm2-135m.yaml``) and its tokenizer, KVBench's loader."""
    from omegaconf import OmegaConf

    from runners.models.loading import load_model, load_tokenizer

    cfg = OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml")
    return load_model(cfg), load_tokenizer(cfg)


def real_prompts(tokenizer) -> list[torch.Tensor]:
    """``[1, n]`` ids of the real prompts (module docstring), read from ``KVBENCH_DATA_DIR``."""
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


def kvpress_inputs(out: Path, attns: tuple[str, ...]) -> tuple[dict, list[torch.Tensor]]:
    """kvpress's side: a model per attention implementation in ``attns`` and the ``[1, n]`` prompts:
    the real ones KVBench's side exported to ``out`` (``out/model``), else the tiny model's (its
    weights, those of ``attns[0]``, and the prompts saved to ``out`` for KVBench's side)."""
    if (out / "model").is_dir():
        from transformers import AutoModelForCausalLM

        load = AutoModelForCausalLM.from_pretrained
        models = {attn: load(out / "model", attn_implementation=attn).eval() for attn in attns}
        return models, torch.load(out / "prompts.pt")
    models = {attn: tiny_llama(attn) for attn in attns}
    torch.save(models[attns[0]].state_dict(), out / "weights.pt")
    seeds = [torch.Generator().manual_seed(s) for s in range(3)]
    prompts = [torch.randperm(VOCAB, generator=g)[:N][None] for g in seeds]
    torch.save(prompts, out / "prompts.pt")  # distinct tokens: every value row is distinct
    return models, prompts


def kvbench_inputs(out: Path, real: bool) -> tuple:
    """KVBench's side: ``(model, tokenizer, prompts, theirs)``: the embedded model (``real``) or the tiny
    one with the weights kvpress's side saved (its tokenizer where that side saved one in
    ``out/tokenizer``, else None), the prompts and kvpress's results (``out/kvpress.json``)."""
    if real:
        model, tokenizer = real_model()
    else:
        model, tokenizer = tiny_llama("kvbench"), None
        if (out / "tokenizer").is_dir():
            tokenizer = tiny_tokenizer(out / "tokenizer")
        model.load_state_dict(torch.load(out / "weights.pt"))
    return model, tokenizer, torch.load(out / "prompts.pt"), json.loads((out / "kvpress.json").read_text())


def prefill(model, ids: torch.Tensor, method, budget):
    """KVBench's cache after ``method`` prefilled ``ids`` ``[1, n]`` (and before the one new token)."""
    from runners.generation.greedy import greedy_generate

    seen: list = []
    greedy_generate(model, ids, method, budget, 1, set(), lambda c: seen or seen.append(c))
    return seen[0]


def jaccard_index(ours: set, theirs: set) -> float:
    """``|ours & theirs| / |ours | theirs|``: 1.0 where the two sets are identical."""
    return len(ours & theirs) / len(ours | theirs)


def agreement(name: str, jaccard: list[float], width: int, sets: str = "", digits: int = 3) -> str:
    """The line ``<name> identical <sets>k/n  Jaccard mean .. min ..`` over the Jaccard indices."""
    same, mean = sum(j == 1.0 for j in jaccard), sum(jaccard) / len(jaccard)
    head = f"{name:{width}s} identical {sets}{same}/{len(jaccard)}"
    return f"{head}  Jaccard mean {mean:.{digits}f} min {min(jaccard):.3f}"


def export_model(model, tokenizer, folder: Path) -> None:
    """Save KVBench's loaded model (sdpa attention) and tokenizer as kvpress's side loads them."""
    model.config.attn_implementation = "sdpa"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)  # KVzipPress loads it from name_or_path


def parser(doc: str, real: bool = True) -> argparse.ArgumentParser:
    """The arguments every script takes: ``--kvpress-python``, ``--real`` (where ``real``) and the hidden
    ``--kvpress-side FOLDER`` of the re-run."""
    cli = argparse.ArgumentParser(description=doc.splitlines()[0])
    cli.add_argument("--kvpress-python", help="python of a venv with kvpress installed")
    if real:
        cli.add_argument("--real", action="store_true", help="the embedded model on real prompts")
    cli.add_argument("--kvpress-side", type=Path, help=argparse.SUPPRESS)  # the re-run under kvpress
    return cli


def rerun(args: argparse.Namespace, script: str, folder: str, *flags: str) -> None:
    """Run ``script`` again under ``--kvpress-python`` as kvpress's side, on ``folder``."""
    subprocess.run([args.kvpress_python, script, "--kvpress-side", folder, *flags], check=True)


def main(
    doc: str,
    script: str,
    kvpress_side: Callable[[Path], None],
    kvbench_side: Callable[[Path, bool], None],
    check: Callable[[], object] | None = None,
) -> None:
    """A script's command line: under kvpress's interpreter ``kvpress_side(folder)``; else ``check()``
    (bad input refused before any work), then (the real model and prompts exported first, with
    ``--real``) the re-run, then ``kvbench_side(folder, real)``."""
    cli = parser(doc)
    args = cli.parse_args()
    if args.kvpress_side is not None:
        kvpress_side(args.kvpress_side)
        return
    if not args.kvpress_python:
        cli.error("--kvpress-python is required")
    sys.path.insert(0, str(REPO))
    if check is not None:
        check()
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:  # KVBench's loader reads the GGUF; kvpress's side reads these weights
            model, tokenizer = real_model()
            export_model(model, tokenizer, Path(tmp) / "model")
            torch.save(real_prompts(tokenizer), Path(tmp) / "prompts.pt")
            del model
        rerun(args, script, tmp)
        kvbench_side(Path(tmp), args.real)
