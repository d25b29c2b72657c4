"""``python -m reports <command>``: figures and tables from the result store (docs/reports.md).

Commands without an experiment file: ``budget`` (quality vs KV budget), ``niah`` (needle heatmap),
``pareto`` (quality vs KV memory), ``memory`` (memory and tokens/s vs context), ``ruler`` (the
RULER leaderboard per compression ratio), ``runs`` (every
stored run, one line each), ``summary`` (methods ranked per budget), ``table`` (rebuild
``table.csv``/``.parquet``), ``reindex``; or an experiment name (``zsmerge_table2``) for its table
and figure. Reads only the store (``--results-dir``, default ``$KVBENCH_RESULTS_DIR`` or
``results``) and writes into ``--out`` (default ``<results-dir>/reports``); never imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from reports.cli import Parser, check_out, default_results_dir, open_store, positive_int, run
from reports.paired import RESAMPLES
from reports.runs import Filters
from reports.versus import check_baseline
from runners.results.store import ResultStore, renamed_override
from tasks.errors import KVBenchError

FIGURES = ("budget", "niah", "pareto", "memory")
COMMANDS = (*FIGURES, "ruler", "runs", "summary", "table", "reindex")
#: The commands that compare methods (``--baseline``); experiment reports do too.
COMPARED = ("ruler", "summary", "budget")


def _figures(args, store: ResultStore) -> list:
    from reports import budget_figure, memory, niah, pareto

    filters = Filters(args.task, args.model, args.method, args.runner, args.budget_unit, args.limit)
    builders: dict[str, Callable[[], list]] = {
        "budget": lambda: budget_figure.build(store, filters, args.metric, args.baseline, args.resamples),
        "niah": lambda: niah.build(store, filters, args.metric),
        "pareto": lambda: pareto.build(store, filters, args.metric, args.memory),
        "memory": lambda: memory.build(store, filters),
    }
    return builders[args.name]()


def figure_command(args, store: ResultStore, out: Path) -> int:
    """Draw a figure report; print where its PNG, PDF and CSV went and any warnings."""
    for plot in _figures(args, store):
        files = plot.save(out)
        if plot.text:
            print(plot.text)
        for note in plot.notes:
            print(note, file=sys.stderr)
        print("written: " + ", ".join(str(p) for p in files))
    return 0


def ruler_command(args, store: ResultStore, out: Path) -> int:
    """The RULER leaderboard: Markdown tables on stdout and in ``ruler.md``, the figure and its CSV."""
    from reports import ruler, ruler_dots, ruler_figure, ruler_table

    filters = Filters(args.task, args.model, args.method, args.runner, args.budget_unit, args.limit)
    found = ruler.rows(store, filters)
    compared = ruler_table.paired(ruler.leaderboard(found.frame), store, args.baseline, args.resamples)
    text = ruler_table.markdown(compared.frame, args.label, found.pairing, compared)
    plot = ruler_dots.draw(compared.frame, args.label, found.pairing)
    files = plot.save(out) + ruler_figure.draw(compared.frame, args.label, found.pairing).save(out)
    (out / "ruler.md").write_text(text, encoding="utf-8")
    print(text)
    for note in found.notes + plot.notes:
        print(note, file=sys.stderr)
    print("written: " + ", ".join(str(p) for p in [*files, out / "ruler.md"]))
    return 0


def runs_command(args, store: ResultStore, out: Path) -> int:
    """Print every stored run, one compact line each, oldest first; then name the settings run on
    several inputs (reports show the newest finished run of each)."""
    from tabulate import tabulate

    from reports.pairing import other_inputs
    from reports.runs import runs_frame
    from reports.tables import runs_table

    filters = Filters(args.task, args.model, args.method, args.runner, args.budget_unit, args.limit)
    table = runs_table(store, filters)
    if table.empty:
        raise KVBenchError(f"no runs under {store.root}/runs match the filters")
    rows = table.to_numpy().tolist()
    print(tabulate(rows, headers=list(table.columns), tablefmt="plain", disable_numparse=True))
    for other in other_inputs(runs_frame(store, filters, status=None)):
        print(other.note(), file=sys.stderr)
    return 0


def table_command(args, store: ResultStore, out: Path) -> int:
    """Rebuild ``table.csv`` and ``table.parquet`` from the records."""
    from runners.results.store import write_tables

    path = write_tables(store.root)
    print(f"written: {path} and {path.with_suffix('.parquet')}")
    return 0


def reindex_command(args, store: ResultStore, out: Path) -> int:
    """Move records of an older store to their current run ids."""
    moved = store.reindex()
    print(f"{len(moved)} records moved to their current run ids under {store.root}/runs")
    return 0


def summary_command(args, store: ResultStore, out: Path) -> int:
    """Methods ranked per budget across tasks (``summary.md``)."""
    from reports.summary import render

    text, path, warnings = render(store, out, args.resamples, args.baseline)
    print(text)
    for warning in warnings:
        print(warning, file=sys.stderr)
    print(f"written: {path}")
    return 0


def experiment_command(args, store: ResultStore, out: Path) -> int:
    """An experiment's table and figure (``configs/experiment/<name>.yaml``)."""
    from reports.experiment import build

    report = build(args.name, args.scale, store.root, out, args.overrides, args.baseline, args.resamples)
    print(report.markdown)
    for note in report.notes:
        print(note, file=sys.stderr)
    print("written: " + ", ".join(str(p) for p in report.files))
    return 0


HANDLERS: dict[str, Callable] = {name: figure_command for name in FIGURES} | {
    "ruler": ruler_command,
    "runs": runs_command,
    "summary": summary_command,
    "table": table_command,
    "reindex": reindex_command,
}


def parser() -> Parser:
    """The command line (every command shares the store, output and filter options)."""
    p = Parser(prog="python -m reports", description=__doc__.split("\n\n")[0])
    p.add_argument("name", help=f"{', '.join(COMMANDS)}, or an experiment name (configs/experiment)")
    p.add_argument(
        "overrides", nargs="*", help="experiment reports: extra overrides the sweep ran with (seed=0,1)"
    )
    p.add_argument("--results-dir", default=default_results_dir(), help="the result store (must exist)")
    p.add_argument("--out", default=None, help="output directory (default <results-dir>/reports)")
    p.add_argument("--scale", default="smoke", choices=("smoke", "cpu", "paper"), help="experiment reports")
    p.add_argument("--task", help="keep runs of this task (registry name: xsum, infinitebench, ...)")
    p.add_argument("--model", help="keep runs of this model (model.name)")
    p.add_argument("--method", action="append", help="keep this method, preset or label (repeatable)")
    p.add_argument("--runner", help="keep runs of this runner (quality, efficiency, error, oom)")
    p.add_argument("--budget-unit", choices=("prompt", "context", "slots"), help="keep budgets in this unit")
    p.add_argument("--limit", type=positive_int, help="keep runs with this task.limit")
    p.add_argument(
        "--metric", help="budget/pareto: the metric (default the task's first); niah: the needle task"
    )
    p.add_argument(
        "--memory", default="kv", choices=("kv", "peak"), help="pareto: x axis (KV bytes or peak memory)"
    )
    p.add_argument(
        "--label",
        default="ratio",
        choices=("ratio", "budget"),
        help="ruler: label rows by kvpress's compression ratio or by the budget (kept fraction)",
    )
    p.add_argument(
        "--baseline",
        help="ruler, summary, budget, experiment reports: also compare each setting with this method "
        "(or preset) at the same budget or compression ratio",
    )
    p.add_argument(
        "--resamples", type=positive_int, default=RESAMPLES, help="bootstrap resamples of every interval"
    )
    return p


def main(argv: Sequence[str]) -> int:
    """Parse the arguments and write the requested report: one ``error:`` line and exit 2 on bad
    input (:func:`reports.cli.run`), checked before any work where the arguments show it: the
    store must exist (and, but for an experiment report, which lists its missing runs, hold runs),
    ``--out`` must be a directory or creatable."""
    return run(_main, argv)


def _main(argv: Sequence[str]) -> int:
    args = parser().parse_intermixed_args(argv)  # overrides may follow options (the near-miss hints)
    if args.overrides and args.name in COMMANDS:
        raise KVBenchError(f"{args.name} takes no overrides (got {' '.join(args.overrides)})")
    if (renamed := renamed_override(args.overrides)) is not None:
        raise KVBenchError(renamed)
    if args.baseline is not None and args.name in set(COMMANDS) - set(COMPARED):
        raise KVBenchError(
            f"--baseline applies to {', '.join(COMPARED)} and experiment reports, not {args.name}"
        )
    check_baseline(args.baseline)
    store = open_store(args.results_dir, need_records=args.name in COMMANDS)
    out = check_out(Path(args.out) if args.out else store.root / "reports")
    return HANDLERS.get(args.name, experiment_command)(args, store, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
