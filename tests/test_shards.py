"""A run split over shards (``runner.num_shards=N runner.shard_index=I``): every shard is its own run,
the last to finish writes the whole run, which equals the unsharded run (predictions byte for byte,
metrics recomputed from every sample), and reports read an unfinished split as incomplete."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from reports.__main__ import main as reports_main
from runners.results.sharded import INCOMPLETE, ShardedStore, merge, sharded_view
from runners.results.store import ResultStore, run_id, setting_id
from tasks.xsum import rouge_f1
from tests.cli_runs import store_env
from tests.conftest import REPO
from tests.store_runs import ROWS, lines, run, tiny_quality

GRID = ("runner=quality_grid", "runner.methods=[fullkv,snapkv]", "runner.budgets=[0.5]")


@pytest.fixture(scope="module")
def setting(tmp_path_factory, tokenizer) -> list[str]:
    """Overrides of a tiny quality run: a random Llama with the embedded tokenizer, five XSum rows."""
    return tiny_quality(tmp_path_factory.mktemp("shards"), tokenizer, ROWS, max_new_tokens=6)


@pytest.mark.parametrize("kind", ["quality", "quality_grid"])
def test_two_shards_give_the_unsharded_run(tmp_path, monkeypatch, capsys, setting, kind):
    grid = GRID if kind == "quality_grid" else ("method=snapkv", "budget=0.5")
    whole, split = tmp_path / "whole", tmp_path / "split"
    run(whole, *grid, *setting, monkeypatch=monkeypatch)
    for index in (1, 0):  # any order: the last to finish merges
        run(
            split,
            *grid,
            *setting,
            "runner.num_shards=2",
            f"runner.shard_index={index}",
            monkeypatch=monkeypatch,
        )
    assert "merged 2 shards (5 samples)" in capsys.readouterr().out
    expected = {r["run_id"]: r for r in ResultStore(whole / "results").records()}
    store = ShardedStore(split / "results")
    shown = {r["run_id"]: r for r in store.records()}
    assert sorted(shown) == sorted(expected) and len(ResultStore(split / "results").records()) == 3 * len(
        shown
    )
    for rid, record in shown.items():
        assert lines(store, rid) == lines(ResultStore(whole / "results"), rid)  # ids, order, text, bytes
        assert record["metrics"] == expected[rid]["metrics"] and record["status"] == "ok"
        assert record["n_samples"] == 5 and record["shards"]["num_shards"] == 2
        shard_samples = [len(lines(store, r)) for r in record["shards"]["runs"]]
        assert shard_samples == [3, 2]


def test_merge_recomputes_a_corpus_metric_from_every_sample():
    """ROUGE over 3 + 2 samples: the mean over all five, not the mean of the two shards' means."""
    refs = ["the cat sat", "a dog ran far", "rain fell", "the river rose", "sun shone"]
    preds = ["the cat", "dog", "rain fell today", "a river", "moon"]
    config = {"runner": {"name": "quality", "num_shards": 2, "shard_index": 0}, "task": {}}
    shards = [
        {"run_id": f"s{i}", "config": config, "samples_done": n, "status": "ok"} for i, n in ((0, 3), (1, 2))
    ]
    parts = [[{"id": str(i), "prediction": preds[i]} for i in range(j, 5, 2)] for j in (0, 1)]
    score = lambda p: rouge_f1(p, refs)  # noqa: E731
    record, merged = merge(shards, parts, [str(i) for i in range(5)], score)
    assert record["metrics"] == rouge_f1(preds, refs)[0] and [p["prediction"] for p in merged] == preds
    halves = [rouge_f1(preds[j::2], refs[j::2])[0]["rouge1"] for j in (0, 1)]
    assert record["metrics"]["rouge1"] != pytest.approx(sum(halves) / 2)
    assert record["config"]["runner"] == {"name": "quality", "num_shards": 1, "shard_index": 0}
    with pytest.raises(ValueError, match="not the task's samples"):
        merge(shards, parts, [str(i) for i in range(1, 6)], score)


def test_a_shard_is_its_own_run_and_one_shard_keeps_the_ids_of_runs_without_the_option():
    config = {"model": {"name": "m"}, "runner": {"name": "quality", "progress": True}, "task": {"limit": 4}}
    one = config | {"runner": config["runner"] | {"num_shards": 1, "shard_index": 0}}
    shards = [config | {"runner": config["runner"] | {"num_shards": 2, "shard_index": i}} for i in (0, 1)]
    assert setting_id(one) == setting_id(config)
    assert len({setting_id(one), *map(setting_id, shards)}) == 3


def test_reports_name_a_missing_or_failed_shard_and_never_show_the_run_as_finished(
    tmp_path, monkeypatch, capsys, setting
):
    run(tmp_path, "method=snapkv", "budget=0.5", *setting, "runner.num_shards=2", "runner.shard_index=0")
    assert "shard(s) 1 of 2 not finished" in capsys.readouterr().out
    (shown,) = ShardedStore(tmp_path / "results").records()
    assert shown["status"] == INCOMPLETE and "shard(s) 1 missing" in shown["error"]
    assert reports_main(["runs", "--results-dir", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert INCOMPLETE in out and shown["run_id"] in out
    (shard,) = ResultStore(tmp_path / "results").records()
    failed = dict(shard, status="error", error="RuntimeError: node lost")
    failed["config"] = json.loads(json.dumps(shard["config"]))
    failed["config"]["runner"]["shard_index"] = 1
    (view,) = sharded_view([shard, failed | {"run_id": run_id(failed["config"], failed["inputs"])}])
    assert view["status"] == INCOMPLETE and "shard 1 error (RuntimeError: node lost)" in view["error"]


def test_missing_shards_are_named_as_ranges():
    from runners.results.sharded import shard_ranges

    assert shard_ranges([9, 1, 2, 3, 7, 10]) == "1-3, 7, 9-10"
    assert shard_ranges(range(1, 130)) == "1-129" and shard_ranges([4]) == "4"


def test_a_merge_missed_by_the_last_shard_is_made_when_any_shard_runs_again(tmp_path, capsys, setting):
    shard = ("method=snapkv", "budget=0.5", *setting, "runner.num_shards=2")
    for index in (0, 1):
        run(tmp_path, *shard, f"runner.shard_index={index}")
    (whole,) = [r for r in ShardedStore(tmp_path / "results").records() if r["status"] == "ok"]
    shutil.rmtree(ResultStore(tmp_path / "results").run_dir(whole["run_id"]))  # as if killed before merging
    (shown,) = ShardedStore(tmp_path / "results").records()
    assert shown["status"] == INCOMPLETE and "not merged yet" in shown["error"]
    capsys.readouterr()
    run(tmp_path, *shard, "runner.shard_index=0")
    out = capsys.readouterr().out
    assert "already finished" in out and "loading model" not in out and "merged 2 shards" in out
    assert ShardedStore(tmp_path / "results").records()[0]["metrics"] == whole["metrics"]


@pytest.mark.parametrize(
    "options",
    [("runner.shard_index=2",), ("runner.shard_index=-1",), ("runner.shard_index=0.5",),
     ("runner.shard_index=one",), ("runner.num_shards=0",), ("runner.num_shards=true",),
     ("runner=quality_grid", "runner.shard_index=2"), ("runner.num_shards=6", "runner.shard_index=5")],
)  # fmt: skip
def test_bad_shard_options_are_one_error_line_before_any_model_loads(run_py, setting, options):
    result = run_py("method=snapkv", "budget=0.5", *setting, "runner.num_shards=2", *options)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: runner.")
    assert "loading model" not in result.stdout


def test_a_slurm_job_array_of_shards_composes():
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("config", ["hydra/launcher=slurm_gpu", "runner.num_shards=4", "runner.shard_index=3"],
                      return_hydra_config=True)  # fmt: skip
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.gpus_per_node == 1
    assert (cfg.runner.num_shards, cfg.runner.shard_index) == (4, 3)
    (sweep,) = OverridesParser.create().parse_overrides(["runner.shard_index=range(4)"])
    assert list(sweep.sweep_iterator()) == [0, 1, 2, 3]


@pytest.mark.integration
def test_shards_run_as_parallel_local_processes_through_submitit(tmp_path, setting):
    env = store_env(tmp_path) | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=submitit_local", "method=snapkv", "budget=0.5",
           *setting, "runner.num_shards=2", "runner.shard_index=range(2)"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].endswith(": 2 ok / 0 failed / 0 skipped")
    (whole,) = ShardedStore(tmp_path / "results").records()
    assert whole["status"] == "ok" and whole["n_samples"] == 5
    jobs = {r["sweep"]["job_num"]: r for r in ResultStore(tmp_path / "results").records() if r.get("sweep")}
    assert sorted(jobs) == [0, 1] and jobs[0]["device"]["threads"] == 1
