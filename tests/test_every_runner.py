"""Every runner on a model saved with ``save_pretrained`` (``model=hf model.id=<folder>``), with
nothing about the model set by hand: its context, dtype and name come from its own config."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from runners.registry import RUNNER_REGISTRY
from tests.architectures import tiny_family
from tests.conftest import REPO

CONTEXT = 600  # the saved config's max_position_embeddings: the only source of the context

RUNNERS = {
    "quality": ["method=h2o", "budget=0.5", "task.limit=1", "task.max_new_tokens=3"],
    "error": ["method=h2o", "runner.budgets=[0.5]", "runner.decode_tokens=3", "task.limit=1"],
    "efficiency": ["method=h2o", "budget=0.5", "runner.prompt_len=16", "runner.gen_len=3",
                   "runner.repeats=1", "runner.warmup_steps=0"],
    "oom": ["method=h2o", "budget=0.5", "runner.prompt_len=16", "runner.gen_len=2", "runner.high=2"],
    "train_less": ["method=less", "budget=0.5", "runner.windows=2", "runner.val_windows=1",
                   "runner.window_length=32", "runner.epochs=1", "runner.hidden=16"],
}  # fmt: skip


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, tokenizer) -> str:
    """A tiny random Llama and the embedded model's tokenizer, saved into one folder."""
    folder = tmp_path_factory.mktemp("saved") / "tiny-saved-llama"
    model = tiny_family("llama", vocab_size=len(tokenizer), max_position_embeddings=CONTEXT)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_runner_runs_a_saved_model_with_nothing_set_by_hand(tmp_path, data_dir, saved_model, runner):
    overrides = [
        "model=hf", f"model.id={saved_model}", f"runner={runner}", "runner.progress=false", "logger=table",
        f"task.data_dir={data_dir}", f"paths.results_dir={tmp_path}", *RUNNERS[runner],
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    record = RUNNER_REGISTRY[runner](cfg)
    assert record["status"] == "ok", record.get("error")
    model = record["config"]["model"]
    assert model["name"] == "tiny-saved-llama" and model["max_context"] == CONTEXT
    metric = next(iter(record["metrics"].values()))
    assert metric is not None and metric >= 0, record["metrics"]
