"""Every runner on a model saved with ``save_pretrained`` (``model=hf model.id=<folder>``), with
nothing about the model set by hand: its context, dtype and name come from its own config; and
the command an error suggests for such a model works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runners.registry import RUNNER_REGISTRY
from runners.setup.build import build_method, model_options
from runners.setup.settings import read_settings
from tasks.errors import KVBenchError
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


def compose_run(*overrides: str):
    """The settings of a run (``runners.setup.settings.read_settings``, the door of ``run.py``)."""
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return read_settings(compose(config_name="config", overrides=list(overrides)))


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
    record = RUNNER_REGISTRY[runner](compose_run(*overrides))
    assert record["status"] == "ok", record.get("error")
    model = record["config"]["model"]
    assert model["name"] == "tiny-saved-llama" and model["max_context"] == CONTEXT
    metric = next(iter(record["metrics"].values()))
    assert metric is not None and metric >= 0, record["metrics"]
    if runner in ("quality", "efficiency"):  # the run's peak and the process's, loading included
        eff = record["efficiency"]
        assert eff["peak_rss_process_bytes"] >= (eff.get("peak_rss_bytes") or eff["peak_memory_bytes"]) > 0


def test_missing_less_kernels_name_a_training_command_that_works(tmp_path, data_dir, saved_model):
    """The error gives the options that select this model (not its derived name, which is no
    preset); running that command trains the kernels the first run then finds."""
    where = f"paths.checkpoints_dir={tmp_path}"
    run = ["model=hf", f"model.id={saved_model}", "method=less", "budget=0.3", where]
    with pytest.raises(KVBenchError, match="no trained LESS kernels") as err:
        build_method(compose_run(*run))
    command = str(err.value).split("`")[1].split()
    assert command[:3] == ["python", "run.py", "runner=train_less"]
    assert f"model.id={saved_model}" in command and "model=tiny-saved-llama" not in command
    small = ["runner.windows=2", "runner.val_windows=1", "runner.window_length=32", "runner.epochs=1",
             "runner.progress=false", "logger=table", f"task.data_dir={data_dir}", where]  # fmt: skip
    train = compose_run(*command[2:], *small)
    assert RUNNER_REGISTRY["train_less"](train)["status"] == "ok"
    layers = json.loads((Path(saved_model) / "config.json").read_text())["num_hidden_layers"]
    assert len(build_method(compose_run(*run)).kernels) == layers  # found: one kernel per layer


def test_a_batched_quality_run_stores_what_batch_one_stores(tmp_path, data_dir, saved_model):
    """``runner.batch_size=3`` on six XSum articles of different lengths (rows end at different steps):
    the same predictions, in sample order, and the same per-sample budgets and bytes, under its own
    run id; batch 1's id is that of a run stored before the option existed."""
    common = ["model=hf", f"model.id={saved_model}", "method=h2o", "budget=0.3", "task.limit=6",
              "task.max_new_tokens=8", "model.max_context=2048", "runner.progress=false", "logger=table",
              f"task.data_dir={data_dir}",
              f"paths.results_dir={tmp_path}"]  # fmt: skip
    one, three = (RUNNER_REGISTRY["quality"](compose_run(*common, f"runner.batch_size={n}")) for n in (1, 3))
    assert one["status"] == three["status"] == "ok" and one["run_id"] != three["run_id"]
    files = [tmp_path / "runs" / r["run_id"] / "predictions.jsonl" for r in (one, three)]
    rows = [[json.loads(x) for x in f.read_text().splitlines()] for f in files]
    fields = ("id", "prediction", "prompt_tokens", "generated_tokens", "budget_slots", "kv_bytes_end")
    assert [[p[f] for f in fields] for p in rows[0]] == [[p[f] for f in fields] for p in rows[1]]
    assert len({p["prompt_tokens"] for p in rows[0]}) > 1 and one["metrics"] == three["metrics"]
    assert three["config"]["runner"]["batch_size"] == 3 and three["efficiency"]["samples_per_s"] > 0


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ({"loader": "gguf", "path": "/m/qwen-coder.gguf", "name": "qwen-coder"},
         "model=gguf model.path=/m/qwen-coder.gguf"),
        ({"loader": "hf", "id": "Org/Model-7B", "name": "Model-7B"}, "model=hf model.id=Org/Model-7B"),
        ({"loader": "hf", "id": "meta-llama/Llama-2-7b-hf", "name": "llama2-7b"},
         "model=hf model.id=meta-llama/Llama-2-7b-hf model.name=llama2-7b"),
        ({"loader": "embedded_gguf", "name": "smollm2-135m"}, "model=smollm2-135m"),
    ],
)  # fmt: skip
def test_model_options_select_the_model_again(model, options):
    assert model_options(OmegaConf.create(model)) == options
