"""``python -m reports <experiment> [--scale smoke|paper]``: an experiment's table and figure;
``python -m reports summary``: methods ranked per budget across tasks; ``python -m reports runs``:
every stored run as one table; ``python -m reports table``: rebuild ``table.csv`` / ``table.parquet``
from the records; ``python -m reports reindex``: move records of an older store to
their current run ids (``ResultStore.reindex``). Reads only the result store (``--results-dir``, default
``$KVBENCH_RESULTS_DIR`` or ``results``) and writes into ``--out`` (default ``<results-dir>/reports``).
"""

from __future__ import annotations

import argparse
import os
import sys

import pandas as pd

from runners.errors import KVBenchError
from runners.loggers import flat_summary, write_tables
from runners.results import ResultStore
from runners.sweeps import experiment_names


def list_runs(store: ResultStore) -> int:
    """Print the result store's runs (identity, status, metrics, efficiency) as a table."""
    records = store.records()
    if not records:
        print(f"no records under {store.root}/runs", file=sys.stderr)
        return 1
    frame = pd.DataFrame([flat_summary(r) for r in records])
    cols = [c for c in frame.columns if not c.startswith("method.") and c not in ("created",)]
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(frame[cols].to_string(index=False))
    return 0


def main(argv: list[str]) -> int:
    """Parse the arguments and write the requested report."""
    parser = argparse.ArgumentParser(prog="python -m reports", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "name", help=f"summary, runs, table, reindex, or an experiment: {', '.join(experiment_names())}"
    )
    parser.add_argument("overrides", nargs="*", help="extra overrides the sweep ran with (seed=0,1,2)")
    parser.add_argument("--scale", default="smoke", choices=("smoke", "paper"))
    parser.add_argument("--results-dir", default=os.environ.get("KVBENCH_RESULTS_DIR", "results"))
    parser.add_argument("--out", default=None, help="output directory (default <results-dir>/reports)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (summary)")
    args = parser.parse_args(argv)
    store = ResultStore(args.results_dir)
    out = args.out or str(store.root / "reports")
    if args.name == "runs":
        return list_runs(store)
    if args.name == "table":
        path = write_tables(store.root)
        print(f"written: {path} and {path.with_suffix('.parquet')}")
        return 0
    if args.name == "reindex":
        moved = store.reindex()
        print(f"{len(moved)} records moved to their current run ids under {store.root}/runs")
        return 0
    if args.name == "summary":
        text, path = render_summary(store, out, args.resamples)
        print(text)
        print(f"written: {path}")
        return 0
    from reports.experiment import build

    try:
        report = build(args.name, args.scale, store.root, out, args.overrides)
    except KVBenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.markdown)
    print("written: " + ", ".join(str(p) for p in report.files))
    return 0


def render_summary(store: ResultStore, out: str, resamples: int):
    """:func:`reports.summary.render` (imported here: scipy loads only for this report)."""
    from reports.summary import render

    return render(store, out, resamples)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
