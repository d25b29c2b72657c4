"""``python -m reports.compare [results_dir] [--results-dir D] [--task T] [--markdown]``: methods
side by side.

One table per task, one row per finished quality run (efficiency, error and OOM records have
their own report, ``python -m reports.efficiency``): model, method preset and the settings that
differ from it, budget and its unit, quality metrics, decode speed and memory. A setting run on
several inputs is one row, its newest finished run; the others are named in a note. Empty cells
print as ``–``. The store is ``results_dir``, ``--results-dir``, ``$KVBENCH_RESULTS_DIR`` or ``results``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd

from reports import cli
from reports.incomplete import suffix
from reports.paired import RESAMPLES
from reports.pairing import Pairing, describe, pair_frame
from reports.persample import setting_scores, stratum
from reports.presets import non_default_settings
from reports.runs import Filters, records_frame
from reports.tables import DASH, budget_text, display, missing
from reports.versus import Compared, check_baseline, differences
from runners.results.store import ResultStore
from tasks.errors import KVBenchError

__all__ = ["comparison", "main", "non_default_settings"]

EFFICIENCY_COLUMNS = {  # record key: (column, decimals)
    "decode_tokens_per_s": ("decode tok/s", 1),
    "prefill_tokens_per_s": ("prefill tok/s", 0),
    "kv_bytes_end_mean": ("KV bytes", 0),
    "allocated_bytes_end_mean": ("allocated bytes", 0),
    "kv_fraction_of_fullkv": ("KV / FullKV", 3),
    "prefill_kept_fraction": ("prompt kept", 3),
    "prefill_head_slots_min": ("head slots min", 0),
    "prefill_head_slots_max": ("head slots max", 0),
    "peak_rss_bytes": ("peak RSS MiB", 0),
}


def quality_runs(records: list[dict], task: str | None = None) -> pd.DataFrame:
    """The finished quality runs of ``records`` (:func:`reports.runs.row` rows), of ``task`` only
    when given."""
    frame = records_frame(records, Filters(task=task))
    return frame[frame["runner"].isna() | (frame["runner"] == "quality")]


def comparison(records: list[dict], task: str | None = None, pairing: Pairing | None = None) -> pd.DataFrame:
    """Finished quality records as a table sorted by model, budget (descending; FullKV first) and
    method.

    Parameters
    ----------
    records : list[dict]
        Run records (docs/results.md).
    task : str | None
        Keep only this task.
    pairing : Pairing | None
        Keep only the runs it pairs on the same samples (:func:`reports.pairing.pair_frame` of
        :func:`quality_runs`); None keeps every run.
    """
    by_id = {r["run_id"]: r for r in records}
    frame = quality_runs(records, task)
    if pairing is not None:
        frame = frame[frame["run_id"].isin(pairing.kept)]
    rows = []
    for _, run in frame.iterrows():
        rec = by_id[run["run_id"]]
        eff = rec.get("efficiency") or {}
        row = {
            "task": run["task"],
            "model": run["model"],
            "method": run["method"],
            "preset": run["preset"],
            "settings": run["settings"],
            "budget": run["budget"],
            "budget unit": "" if missing(run["budget_unit"]) else run["budget_unit"],
            "budget realised": bool(run["budget_realised"]),
            "n": run["n"],
            "run_id": run["run_id"],
        }
        row.update({k: round(v, 2) for k, v in run["metrics"].items()})
        for key, (label, decimals) in EFFICIENCY_COLUMNS.items():
            value = eff.get(key)
            value = value / 2**20 if key == "peak_rss_bytes" and value else value
            row[label] = None if value is None else round(value, decimals) if decimals else round(value)
        row["wall s"] = round(rec.get("wall_seconds") or 0)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["_budget"] = out["budget"].astype(float).fillna(float("inf"))
    out = out.sort_values(["task", "model", "_budget", "method"], ascending=[True, True, False, True])
    efficiency = [label for label, _ in EFFICIENCY_COLUMNS.values()] + ["wall s", "run_id"]
    out = out[[c for c in out.columns if c not in efficiency] + efficiency]
    for label, decimals in EFFICIENCY_COLUMNS.values():
        if decimals == 0 and label in out:
            out[label] = out[label].astype("Int64")
    return out.drop(columns="_budget").reset_index(drop=True)


def paired(
    store: ResultStore,
    frame: pd.DataFrame,
    runs: pd.DataFrame,
    baseline: str | None = None,
    n_resamples: int = RESAMPLES,
) -> Compared:
    """Each run of :func:`comparison`'s ``frame`` against FullKV and ``baseline`` at the same budget
    and protocol, in its task's primary metric (the record's first), on the same sample ids
    (:func:`reports.versus.differences`); ``runs`` are :func:`quality_runs` (labels, protocols).

    Raises
    ------
    KVBenchError
        When ``baseline`` has no run on the compared samples, or is ambiguous.
    """
    info = runs.set_index("run_id")
    settings = frame.assign(
        label=frame["run_id"].map(info["label"]),
        reference=frame["run_id"].map(info["reference"]).astype(bool),
        protocol=frame["run_id"].map(info["protocol"]),
        metric=frame["run_id"].map(info["metrics"].map(lambda ms: next(iter(ms), None))),
    )
    scores = [setting_scores(store, [r.run_id], r.task, str(r.metric))[0] for r in settings.itertuples()]
    level = ["budget", "budget unit", "protocol"]
    return differences(settings, scores, ["task", "model"], level, baseline, n_resamples)


def main(argv: Sequence[str]) -> int:
    """Print the comparison table (plain text, or Markdown with ``--markdown``); bad input (an
    unknown option, a missing store, no finished quality run) is one ``error:`` line, exit 2."""
    return cli.run(_main, argv)


def _main(argv: Sequence[str]) -> int:
    parser = cli.Parser(prog="python -m reports.compare", description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", nargs="?", default=None)
    parser.add_argument("--results-dir", dest="results_dir_opt", default=None)
    parser.add_argument("--task", default=None)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--baseline", help="also compare each run with this method (or preset) at its budget")
    parser.add_argument("--resamples", type=cli.positive_int, default=RESAMPLES, help="bootstrap resamples")
    args = parser.parse_args(argv)
    check_baseline(args.baseline)
    root = args.results_dir or args.results_dir_opt or cli.default_results_dir()
    store = cli.open_store(root)
    records = store.records()
    runs = quality_runs(records, args.task)
    pairing = pair_frame(store, runs)
    frame = comparison(records, args.task, pairing)
    if frame.empty:
        of_task = f" of task {args.task}" if args.task else ""
        raise KVBenchError(
            f"no finished quality runs{of_task} under {root}/runs" + suffix(pairing.incomplete)
        )
    found = paired(store, frame, runs, args.baseline, args.resamples)
    metric = found.frame.groupby("task")["metric"].first()
    where = frame.columns.get_loc("decode tok/s")
    for header, cells in found.text_columns().items():
        frame.insert(where, header, cells)
        where += 1
    frame["budget"] = [
        f"kept {100 * b:.0f}% of {u}" if kept else budget_text(b, u or None)  # kept: an outcome
        for b, u, kept in zip(frame["budget"], frame["budget unit"], frame["budget realised"], strict=True)
    ]
    frame = frame.drop(columns=["budget unit", "budget realised", "run_id"])
    for task, part in frame.groupby("task", sort=True):
        part = part.drop(columns="task").dropna(axis=1, how="all")  # only this task's metrics
        text = display(part).replace({"": DASH})
        print(f"## {task}\n" if args.markdown else f"task: {task}")
        print(text.to_markdown(index=False) if args.markdown else text.to_string(index=False))
        rows = found.frame[found.frame["task"] == task]
        caption = replace(found, stratified=stratum(task, metric[task])).caption(rows, str(metric[task]))
        print(f"\n{caption}\n" if args.markdown else f"{caption}\n")
    for (model, task), key in pairing.samples.items():
        print(f"compared on the same samples: {model}, {task}: {describe(key)}")
    for note in pairing.notes():
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
