"""Quality runs in process on the tiny model against a result store: composed configs, a tiny quality
task, a run of them (:func:`run`) and the lines a store holds."""

from __future__ import annotations

import json

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from runners.registry import run_from_config
from runners.results.store import ResultStore
from tests.architectures import tiny_family
from tests.conftest import REPO


def tiny_quality(root, tokenizer, rows: list[dict], max_new_tokens: int) -> list[str]:
    """Overrides of a quality run of a random Llama with ``tokenizer`` (saved under ``root``) on the
    XSum ``rows`` (all of them), ``max_new_tokens`` each."""
    tiny_family("llama", vocab_size=len(tokenizer), max_position_embeddings=4096).save_pretrained(root / "m")
    tokenizer.save_pretrained(root / "m")
    (root / "data" / "xsum").mkdir(parents=True)
    (root / "data" / "xsum" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["model=hf", f"model.id={root / 'm'}", f"task.data_dir={root / 'data'}", f"task.limit={len(rows)}",
            f"task.max_new_tokens={max_new_tokens}", "logger=table", "runner.progress=false"]  # fmt: skip


def composed(tmp_path, *overrides: str, monkeypatch=None):
    """The run config of ``overrides``; with ``monkeypatch``, also Hydra's view of this job (a grid
    composes its settings from the job's overrides), restored after the test."""
    overrides = (*overrides, f"paths.results_dir={tmp_path / 'results'}")
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=monkeypatch is not None)
    if monkeypatch is not None:
        monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


ROWS = [
    {"document": f"Story {i}: rain fell on town {i}; the river rose {i} metres.", "summary": f"Rain {i}.",
     "id": str(100 + i)} for i in range(5)
]  # fmt: skip


def lines(store: ResultStore, rid: str) -> list[str]:
    """A run's predictions.jsonl lines without their timings, as stored (key order included)."""
    text = (store.run_dir(rid) / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.dumps({k: v for k, v in json.loads(t).items() if k not in TIMINGS}) for t in text]


def run(path, *overrides, monkeypatch=None) -> dict:
    return run_from_config(composed(path, *overrides, monkeypatch=monkeypatch))


TIMINGS = ("prefill_seconds", "decode_seconds")  # the only fields of a line that two runs may differ in
