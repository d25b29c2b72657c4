"""Runs split over shards (``runner.num_shards=N runner.shard_index=I``, docs/runners.md): shard I
evaluates samples I, I+N, I+2N, ... of the task (datasets' ``Dataset.shard`` with
``contiguous=False``) and is stored as its own run. The one place that knows how shards make a run:

- :func:`merge` builds the run of every sample from its finished shards: the per-sample lines back
  in sample order and the metrics recomputed from their union by the task's own scorer (a corpus
  metric is never averaged over shards), stored under the id the unsharded run has (the runner of
  the last shard to finish writes it: ``runners.sweeps.shards``);
- :class:`ShardedStore` is the store as every report reads it: a merged run in place of its shards,
  and a run whose shards have not all finished as one record of status ``incomplete`` that names
  the missing and failed shards, never as a finished run.

Nothing here imports torch.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable, Sequence

from runners.results.store import ResultStore, by_age, run_id, setting_id, setting_of

#: The status reports give a sharded run whose shards have not all finished (or are not merged).
INCOMPLETE = "incomplete"


def shard_of(config: dict) -> tuple[int, int] | None:
    """``(num_shards, shard_index)`` of a run config split over several shards, else None."""
    runner = config.get("runner") if isinstance(config.get("runner"), dict) else {}
    count = runner.get("num_shards", 1)
    return (count, runner.get("shard_index", 0)) if isinstance(count, int) and count > 1 else None


def with_shard(config: dict, num_shards: int, shard_index: int) -> dict:
    """A copy of run config ``config`` as shard ``shard_index`` of ``num_shards`` (1, 0: unsharded)."""
    out = copy.deepcopy(config)
    out["runner"] = {**out.get("runner", {}), "num_shards": num_shards, "shard_index": shard_index}
    return out


def whole_run_id(config: dict, inputs: dict | None) -> str:
    """The id of the run a shard belongs to: the unsharded run's (``runners.results.store.run_id``)."""
    return run_id(with_shard(config, 1, 0), inputs)


def shard_run_ids(config: dict, inputs: dict | None) -> list[str]:
    """The run ids of every shard of the sharded run ``config`` (a shard's config), in shard order."""
    count = shard_of(config)[0]
    return [run_id(with_shard(config, count, i), inputs) for i in range(count)]


def in_sample_order(parts: Sequence[Sequence]) -> list:
    """The shards' items in sample order: item ``i`` of the run is item ``i // N`` of shard ``i % N``.

    Raises
    ------
    ValueError
        If the shards' sizes are not those of one split (shard ``j`` holds ``len(range(j, n, N))``).
    """
    count, total = len(parts), sum(len(p) for p in parts)
    if [len(p) for p in parts] != [len(range(j, total, count)) for j in range(count)]:
        raise ValueError(f"shard sizes {[len(p) for p in parts]} are not one split of {total} samples")
    return [parts[i % count][i // count] for i in range(total)]


def _same(values: list, counts: list[int]) -> object:
    return values[0] if all(v == values[0] for v in values) else None


def _weighted(values: list, counts: list[int]) -> float | list:
    if isinstance(values[0], list):  # per layer
        return [_weighted(list(col), counts) for col in zip(*values, strict=True)]
    return sum(v * c for v, c in zip(values, counts, strict=True)) / sum(counts)


#: How a shard efficiency figure combines into the run's, by key (first match); an unmatched
#: figure is kept where every shard has the same value, else null (a median is not mergeable).
COMBINE: tuple[tuple[Callable[[str], bool], Callable[[list, list[int]], object]], ...] = (
    (lambda k: k.endswith(("_sum", "_total")), lambda v, c: sum(v)),
    (lambda k: k.startswith("peak_") or k.endswith("_max"), lambda v, c: max(v)),
    (lambda k: k.endswith("_min"), lambda v, c: min(v)),
    (lambda k: k.endswith("_mean") or k.startswith("prefill_kept_fraction"), _weighted),
    (lambda k: k == "samples_per_s", lambda v, c: sum(c) / sum(n / s for n, s in zip(c, v, strict=True))),
)


def merged_efficiency(shards: Sequence[dict], lines: Sequence[dict]) -> dict:
    """The run's ``efficiency`` from its shards' (``shards``, in shard order) and the per-sample
    ``lines``: sums summed, means weighted by samples, peaks the largest, ratios of sums recomputed;
    ``samples_per_s`` is of the shards' summed time."""
    effs = [r.get("efficiency") or {} for r in shards]
    counts = [int(r.get("samples_done") or 0) for r in shards]
    out = {}
    for key in dict.fromkeys(k for e in effs for k in e):
        values = [e.get(key) for e in effs]
        rule = next((f for match, f in COMBINE if match(key)), _same)
        out[key] = None if any(v is None for v in values) else rule(values, counts)
    steps = [round(e["decode_tokens_per_s"] * e["decode_seconds_sum"]) for e in effs
             if e.get("decode_tokens_per_s")]  # fmt: skip
    decode_s = sum(e.get("decode_seconds_sum") or 0 for e in effs)
    prefill_s = sum(p.get("prefill_seconds") or 0 for p in lines)
    fullkv = sum(p.get("fullkv_bytes_end") or 0 for p in lines)
    return out | {
        "prefill_tokens_per_s": sum(p["prompt_tokens"] for p in lines) / prefill_s if prefill_s else None,
        "decode_tokens_per_s": sum(steps) / decode_s if steps and decode_s else None,
        "kv_fraction_of_fullkv": sum(p.get("kv_bytes_end") or 0 for p in lines) / fullkv if fullkv else None,
    }


def merge(
    shards: Sequence[dict],
    predictions: Sequence[list[dict]],
    ids: Sequence[str],
    score: Callable[[list[str]], tuple[dict, list[dict]]],
) -> tuple[dict, list[dict]]:
    """The record and per-sample lines of the whole run from its finished shards.

    Parameters
    ----------
    shards : Sequence[dict]
        Every shard's finished (``ok``) record, in shard order.
    predictions : Sequence[list[dict]]
        Every shard's ``predictions.jsonl`` lines, in shard order.
    ids : Sequence[str]
        The task's sample ids in order (the unsharded run's).
    score : Callable
        The task's scorer of the whole run (``Task.score`` with the task's samples): predictions in
        sample order -> (metrics, per-sample metrics). The metrics are its, as in the unsharded run.

    Returns
    -------
    tuple[dict, list[dict]]
        The record, stored under the unsharded run's id (its config with ``num_shards=1``) with
        ``shards`` (count, run ids, wall seconds), and the lines in sample order.

    Raises
    ------
    ValueError
        If the shards' lines are not one split of ``ids`` (another split, another task).
    """
    lines = in_sample_order(predictions)
    if [str(p.get("id")) for p in lines] != [str(i) for i in ids]:
        raise ValueError("the shards' samples are not the task's samples in order")
    metrics, per_sample = score([p["prediction"] for p in lines])
    lines = [p | {"metrics": m} for p, m in zip(lines, per_sample, strict=True)]
    config = with_shard(shards[0]["config"], 1, 0)
    record = copy.deepcopy(shards[0]) | {
        "run_id": run_id(config, shards[0].get("inputs")),
        "setting_id": setting_id(config),
        "config": config,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "sweep": None,
        "n_samples": len(lines),
        "samples_done": len(lines),
        "metrics": metrics,
        "efficiency": merged_efficiency(shards, lines),
        "wall_seconds": sum(r.get("wall_seconds") or 0 for r in shards),
        "shards": {
            "num_shards": len(shards),
            "runs": [r["run_id"] for r in shards],
            "wall_seconds": [r.get("wall_seconds") for r in shards],
        },
    }
    return record, lines


def shard_ranges(indices: Sequence[int]) -> str:
    """Distinct shard indices as runs of consecutive ones: ``[1, 2, 3, 7, 9, 10]`` -> ``"1-3, 7, 9-10"``
    (none: ``""``)."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def incomplete(shards: dict[int, dict], count: int) -> dict:
    """The record reports show for a sharded run without a merged record: status ``incomplete``,
    its ``error`` naming the missing and failed shards (``shards``: index -> the shard's record)."""
    newest = by_age(list(shards.values()))[-1]
    missing = [i for i in range(count) if i not in shards]
    parts = [f"shard(s) {shard_ranges(missing)} missing"] if missing else []
    parts += [f"shard {i} {r['status']} ({r.get('error')})" for i, r in sorted(shards.items())
              if r["status"] != "ok"]  # fmt: skip
    why = "; ".join(parts) or "every shard finished, not merged yet (run any shard's command again)"
    config = with_shard(newest["config"], 1, 0)
    return {
        "run_id": run_id(config, newest.get("inputs")),
        "setting_id": setting_id(config),
        "status": INCOMPLETE,
        "error": f"sharded run of {count} shards: {why}",
        "config": config,
        "shards": {"num_shards": count, "runs": [shards[i]["run_id"] for i in sorted(shards)]},
    } | {k: newest.get(k) for k in ("schema_version", "inputs", "created", "method", "task", "presets")}


def sharded_view(records: Sequence[dict]) -> list[dict]:
    """``records`` as reports read them, ordered by run id: each sharded run once, its merged (or
    unsharded) finished record in place of its shards, else :func:`incomplete`."""
    groups: dict[str, dict[tuple[int, int], dict]] = {}
    for record in records:
        if (shard := shard_of(record.get("config") or {})) is not None:
            whole = whole_run_id(record["config"], record.get("inputs"))
            groups.setdefault(whole, {})[shard] = record
    finished = {r["run_id"] for r in records if r.get("status") == "ok"}
    shown = {}
    for whole, shards in groups.items():
        if whole not in finished:
            count = shard_of(by_age(list(shards.values()))[-1]["config"])[0]  # the newest split
            shown[whole] = incomplete({i: r for (n, i), r in shards.items() if n == count}, count)
    kept = [r for r in records if shard_of(r.get("config") or {}) is None and r["run_id"] not in shown]
    return sorted([*kept, *shown.values()], key=lambda r: r["run_id"])


class ShardedStore(ResultStore):
    """The result store as reports read it (:func:`sharded_view`): every report sees a sharded run
    as one run. Writing is :class:`runners.results.store.ResultStore`'s."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self._view: list[dict] | None = None

    def records(self) -> list[dict]:
        """Every readable record (:meth:`ResultStore.records`) through :func:`sharded_view`."""
        if self._view is None:
            self._view = sharded_view(super().records())
        return list(self._view)

    def of_setting(self, sid: str) -> list[dict]:
        """The records of setting ``sid`` as :meth:`records` shows them, oldest first."""
        return by_age([r for r in self.records() if setting_of(r["run_id"]) == sid])
