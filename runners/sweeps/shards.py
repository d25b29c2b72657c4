"""A quality run split over shards (``runner.num_shards=N runner.shard_index=I``, docs/runners.md):
the checks, the shard's samples, and the merge of the whole run once every shard has finished
(``runners.results.sharded`` builds it; the runner of the last shard to finish writes it).

Each shard is its own run (its id includes the two fields): resumable, locked and stored like any
run. After its record is written, a shard takes the whole run's lock (``runners.results.lock``: the
unsharded run's id, so two shards ending at once merge once) and, when every shard's record is
finished, writes the merged run. Running any shard's command again merges a run whose last shard
ended before it could.
"""

from __future__ import annotations

from omegaconf import DictConfig

from runners.output.record import finish
from runners.output.wandb_logger import read_predictions
from runners.results.lock import lock_run
from runners.results.sharded import merge, shard_of, shard_ranges, shard_run_ids, whole_run_id
from runners.results.store import ResultStore
from tasks import Task
from tasks.errors import KVBenchError


def check_shards(cfg: DictConfig) -> tuple[int, int]:
    """``(runner.num_shards, runner.shard_index)``, checked before any work.

    Raises
    ------
    KVBenchError
        For a count that is not a positive integer, or an index that is not an integer in
        ``[0, num_shards)``.
    """
    count, index = cfg.runner.get("num_shards", 1), cfg.runner.get("shard_index", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise KVBenchError(f"runner.num_shards must be a positive integer, got {count!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise KVBenchError(
            f"runner.shard_index must be an integer from 0 to {count - 1} (runner.num_shards={count}), "
            f"got {index!r}"
        )
    return count, index


def shard_samples(cfg: DictConfig, samples: list, prompts: list) -> tuple[list, list]:
    """The shard's samples and prompts: ``[I::N]`` of the task's (all of them for one shard).

    Raises
    ------
    KVBenchError
        When there are fewer samples than shards (a shard would run none).
    """
    count, index = check_shards(cfg)
    if count > len(samples):
        raise KVBenchError(f"runner.num_shards={count} exceeds the task's {len(samples)} samples")
    return samples[index::count], prompts[index::count]


def merge_when_complete(cfg: DictConfig, store: ResultStore, rid: str, task: Task, samples: list) -> None:
    """Write the whole run of shard ``rid`` (a finished shard's record) once every shard has
    finished; print one line saying what happened. Unsharded runs are left alone.

    Parameters
    ----------
    rid : str
        The run id of this shard (its record is finished in ``store``).
    task, samples
        The task and all its samples, in order: the merged metrics are ``task.score`` of every
        sample's prediction, as the unsharded run computes them.
    """
    shard = store.finished(rid)
    if shard is None or shard_of(shard["config"]) is None:
        return
    whole = whole_run_id(shard["config"], shard.get("inputs"))
    lock_run(store.root, whole)  # two shards ending at once: the second finds the merged run
    if not cfg.rerun and store.finished(whole) is not None:
        print(f"run {whole} (every shard of this run) is finished")
        return
    rids = shard_run_ids(shard["config"], shard.get("inputs"))
    records = [store.finished(r) for r in rids]
    if waiting := [i for i, r in enumerate(records) if r is None]:
        waits = shard_ranges(waiting)
        print(f"run {whole}: shard(s) {waits} of {len(rids)} not finished; merged when they are")
        return
    lines = [read_predictions(store.run_dir(r) / "predictions.jsonl") for r in rids]
    try:
        record, predictions = merge(records, lines, [s.id for s in samples], lambda p: task.score(p, samples))
    except ValueError as err:
        raise KVBenchError(f"run {whole}: its shards cannot be merged: {err}") from err
    finish(cfg, store, record, predictions)
    print(f"run {whole}: merged {len(rids)} shards ({len(predictions)} samples); metrics of the whole run")
