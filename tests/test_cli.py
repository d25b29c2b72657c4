"""``python run.py`` as a user runs it: bad input fails fast in one line; a real run writes a record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.cli_runs import run_cli


def read_only_dir(tmp_path: Path) -> Path:
    """A directory nothing can be written in: mode 0o555, or for root (whom modes do not stop)
    sysfs, where not even root creates a file."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder if os.geteuid() != 0 else Path("/sys")


BAD_INPUT = [
    (["method=nosuch"], "Could not find 'method/nosuch'"),
    (["task=nosuch"], "Could not find 'task/nosuch'"),
    (["model=nosuch"], "Could not find 'model/nosuch'"),
    (["budget=0"], "budget must be > 0"),
    (["budget=-3"], "budget must be > 0"),
    (["budget=1"], "write budget=1.0 for the whole prompt (a fraction), or an integer >= 2"),
    (["method.alpha=7"], "alpha must be in [0, 1]"),
    (["budget_unit=tokens"], "budget_unit must be one of"),
    (["method=less_random"], "runner=quality scores outputs and needs trained ones (method=less)"),
    (["runner=error", "method=less_random"], "runner=error scores outputs"),
    (["device=tpu"], "device=tpu is not a device"),
    (["device=cuda:abc"], "device=cuda:abc is not a device"),
    (["seed=abc"], "seed must be an integer, got 'abc'"),
    (["rerun=maybe"], "rerun must be true or false, got 'maybe'"),
    (["rerun=no"], "rerun must be true or false, got 'no'"),
    (["paths.results_dir={tmp}/file"], "results dir (paths.results_dir, $KVBENCH_RESULTS_DIR) {tmp}/file"),
    (["paths.results_dir={ro}/results"], "$KVBENCH_RESULTS_DIR) {ro}/results is not writable"),
    (["paths.log_dir={tmp}/file"], "log dir (paths.log_dir, $KVBENCH_LOG_DIR) {tmp}/file/xsum/runs/"),
    (["paths.log_dir={ro}/logs"], "is not writable"),
    (["task=niah", "task.lengths=[10]", "task.depths=[0.5]"], "task.lengths [10]: passkey needs at least"),
    (["task.limit=1.5"], "task.limit must be an integer >= 1 or null, got 1.5"),
    (["task.instruction='{{nosuch}}'"], "task.instruction '{{nosuch}}': unknown placeholder {{nosuch}}"),
    (["task.query_aware=false"], "but xsum has no context/question split (its input is an article)"),
    (["task.data_dir={tmp}/data"], "{tmp}/data/xsum/test.jsonl:2: not valid UTF-8 (byte 0xff at column 16)"),
    (["method=duo_attention"], "error: method.pattern must be set"),
    (["method=duo_attention", "method.pattern={tmp}/file"], "is not a tab-separated table of gates"),
    (
        ["method=duo_attention", "method.pattern=tests/data/duo_pattern_2x2.tsv"],
        "the pattern is (2, 2) (layers, KV heads); the model has (30, 3)",
    ),
    (["method=layer_ratios", "method.ratios=[1,2]"], "ratios has 2 entries; the model has 30 layers"),
    (["method=adakv_snapkv", "method.alpha_safeguard=2"], "alpha_safeguard must be in [0, 1], got 2"),
    (["method=tova", "decode_budget=maybe"], "decode_budget must be true, false or null, got 'maybe'"),
    (["compression_ratio=1.0"], "compression_ratio must be in [0, 1) (the fraction removed), got 1.0"),
    (["compression_ratio=0.5", "budget_unit=context"], "compression_ratio is a fraction of the prompt"),
    (["compression_ratio=0.75", "budget=0.5"], "not both (compression_ratio=0.75 is budget=0.25)"),
    (["runner=quality_grid", "runner.methods=[]"], "runner.methods must be a non-empty list"),
    (["runner=quality_grid"], "one of runner.compression_ratios, runner.budgets"),
    (["runner=quality_grid", "method.alpha=0.5"], "method.alpha=0.5 would apply to all"),
    (["runner=quality_grid", "runner.methods=[snapkv,nosuch]", "runner.budgets=[0.1]"], "nosuch with"),
    (["runner=quality_grid", "budget=0.3"], "budget=0.3 would be ignored"),
    (
        ["runner=quality_grid", "runner.budgets=[0.1]", "runner.quants=[int8]", "quant=int4"],
        "quant=int4 would be",
    ),
    (["runner=quality_grid", "runner.budgets=[0.1]", "runner.quants=[int8,int8]"], "list of distinct quant"),
    (
        ["runner=quality_grid", "runner.budgets=[0.1]", "runner.quants=[int3]"],
        "quant=int3: In 'config': Could not find",
    ),
    (
        ["runner=quality_grid", "runner.budgets=[0.1]", "runner.quants=[none,int8]", "runner.batch_size=2"],
        "=1 (got 2)",
    ),
    (
        ["runner=quality_grid", "runner.budgets=[0.1]", "quant=kivi2", "runner.batch_size=3"],
        "quant=kivi2 takes",
    ),
    (["runner=quality_grid", "backend=compiled"], "runner=quality_grid runs eager decode steps"),
    (["task=ruler", "task.query_aware=no"], "task.query_aware must be true or false, got 'no'"),
    (["runner.batch_size=0"], "runner.batch_size must be a positive integer, got 0"),
    (["runner.batch_size=2", "backend=compiled"], "backend=compiled takes runner.batch_size=1"),
    (["runner=efficiency", "runner.batch=8"], "error: runner.batch is now runner.batch_size (write runner."),
    (["runner=oom", "+runner.batch=8"], "runner.batch is now runner.batch_size (write runner.batch_size=8)"),
    (["hydra.searchpath=[file://{tmp}/conf]", "experiment=old_batch"], "a config file still sets runner."),
    (
        ["method=zsmerge", "method.proximity_ratio=1.5"],
        "proximity_ratio must be a fraction below 1 or a whole",
    ),
    (["method=keepkv", "method.threshold=5"], "threshold is a cosine similarity in [-1, 1]"),
    (["method=keepkv", "method.guard=-1"], "guard must be >= 0"),
    (["method=keepkv", "method.max_factor=0"], "max_factor must be finite and > 0"),
    (
        ["task=niah", "task.lengths=[10000]", "+task.max_new_tokens=4"],
        "task.lengths [10000] exceed the model's context",
    ),
    (["+model.device_map=everywhere"], "model.device_map must be one of"),
]
if not torch.cuda.is_available():
    BAD_INPUT.append((["device=cuda"], "device=cuda, but CUDA is not available"))


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUT, ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_is_one_error_line_before_any_model_load(tmp_path, run_py, overrides, message):
    """One ``error:`` line, exit code 2, no model loaded and no record; ``{tmp}`` is a folder
    holding a plain file ``file``, a data dir whose XSum file has invalid UTF-8 on line 2 and a
    config dir whose experiment ``old_batch`` sets ``runner.batch``, ``{ro}`` a read-only directory.
    Run in-process (``run_py``); the command line's own process is exercised by the other tests of
    this file."""
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "data" / "xsum").mkdir(parents=True)
    row = b'{"document": "a", "summary": "b", "id": "%d"}\n'
    (tmp_path / "data" / "xsum" / "test.jsonl").write_bytes(row % 1 + row.replace(b'"a"', b'"a\xff"') % 2)
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    old = "# @package _global_\ndefaults:\n  - override /runner: efficiency\nrunner:\n  batch: 4\n"
    (tmp_path / "conf" / "experiment" / "old_batch.yaml").write_text(old)
    where = {"tmp": tmp_path, "ro": read_only_dir(tmp_path)}
    proc = run_py("task.limit=2", *(o.format(**where) for o in overrides))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert message.format(**where) in lines[0]
    assert "loading model" not in proc.stdout and not (tmp_path / "results").exists()


def test_missing_data_with_no_hub_access(tmp_path):
    proc = run_cli(tmp_path, data_dir=str(tmp_path / "empty"))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing data" in lines[0], proc.stderr
    assert "loading model" not in proc.stdout


@pytest.mark.integration
def test_main_job_writes_record_and_rerun_is_skipped(tmp_path, data_dir):
    proc = run_cli(
        tmp_path, "method=zsmerge", "task=xsum", "budget=0.05", "task.limit=2", data_dir=str(data_dir)
    )
    assert proc.returncode == 0, proc.stderr
    records = list((tmp_path / "results" / "runs").glob("*/record.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["status"] == "ok" and record["n_samples"] == 2 and record["method"] == "zsmerge"
    assert 0 <= record["metrics"]["rougeL"] <= record["metrics"]["rouge1"] <= 100
    eff = record["efficiency"]
    assert eff["kv_bytes_end_mean"] < 0.1 * eff["fullkv_bytes_end_mean"]
    assert eff["decode_tokens_per_s"] > 0 and eff["peak_rss_bytes"] > 0
    predictions = (records[0].parent / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 2 and all(json.loads(p)["prediction"] for p in predictions)
    assert "rouge1" in proc.stdout and "decode tokens/s" in proc.stdout
    assert (tmp_path / "results" / "table.csv").read_text().count("\n") == 2

    again = run_cli(
        tmp_path, "method=zsmerge", "task=xsum", "budget=0.05", "task.limit=2", data_dir=str(data_dir)
    )
    assert again.returncode == 0 and "already finished" in again.stdout
    assert "loading model" not in again.stdout
    assert json.loads(records[0].read_text()) == record


@pytest.mark.integration
def test_prompt_longer_than_context_is_one_error_line_before_generation(tmp_path, data_dir):
    proc = run_cli(tmp_path, "model.max_context=128", "task.limit=2", data_dir=str(data_dir))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "exceeds the context of smollm2-135m (128 tokens)" in lines[0], proc.stderr
    assert "loading model" not in proc.stdout and not (tmp_path / "results" / "runs").exists()


@pytest.mark.integration
def test_needle_grid_and_longbench_run_end_to_end(tmp_path, data_dir):
    proc = run_cli(tmp_path, "task=niah", "task.lengths=[300,600]", "task.depths=[0.5]", "method=zsmerge",
                   "budget=128", data_dir=str(data_dir))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = (tmp_path / "results" / "runs").glob("*/record.json")
    record = json.loads(path.read_text())
    assert record["task"] == "infinitebench" and record["n_samples"] == 2
    assert set(record["metrics"]) == {"avg", "passkey", "passkey/len300/depth0.5", "passkey/len600/depth0.5"}
    assert record["protocol"]["generated"] and record["protocol"]["eos_token_ids"]
    assert record["efficiency"]["prefill_kept_fraction"] < 1.0  # 600-token prompt in 128 slots

    proc = run_cli(tmp_path, "task=longbench", "task.subsets=[samsum]", "task.limit=1", "method=fullkv",
                   data_dir=str(data_dir))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = next(json.loads(p.read_text()) for p in (tmp_path / "results" / "runs").glob("*/record.json")
                  if json.loads(p.read_text())["task"] == "longbench")  # fmt: skip
    assert {"avg", "samsum", "cat/FSHOT"} <= set(record["metrics"])
    assert record["protocol"]["chat_template"] == "thudm" and record["protocol"]["max_input_tokens"] == 7500
    prediction = json.loads((path.parent.parent / record["run_id"] / "predictions.jsonl").read_text())
    assert prediction["meta"]["subset"] == "samsum" and 1 <= prediction["generated_tokens"] <= 128


def test_unknown_longbench_subset_is_one_error_line(tmp_path):
    proc = run_cli(tmp_path, "task=longbench", "task.subsets=[nope]")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "unknown LongBench subset 'nope'" in lines[0], (
        proc.stderr
    )
