"""``python -m reports.efficiency [results_dir] [--markdown]``: the efficiency tables.

Reads the result store only (never re-measures), one run per setting (the newest finished; runs
of the setting on other inputs, and runs whose shards have not all finished, are named in a note):

- throughput: one row per (model, device, prompt_len + gen_len, batch), one column per method
  (with its budget): ``tokens/s / latency s`` as ZSMerge Table 1, ``OOM`` for an OOM run;
- memory: KV bytes at the end, buffer bytes and peak memory (KVMerger Table 2);
- context growth: the ``curve`` points of runs with ``runner.curve_every`` (ZSMerge Figure 3);
- attention error: relative error vs FullKV per budget (ZSMerge Figure 4);
- OOM thresholds: the largest batch or context per method and memory cap.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pandas as pd

from reports import incomplete as left_out
from reports.cli import Parser, default_results_dir, open_store, run
from reports.pairing import OtherInputs, model_key, newest_per_setting
from reports.runs import row
from reports.tables import budget_text
from runners.results.sharded import INCOMPLETE
from tasks.errors import KVBenchError


def _label(record: dict) -> str:
    r = row(record)
    return r["label"] + (
        f" @ {budget_text(r['budget'], r['budget_unit'])}" if r["budget"] is not None else ""
    )


def _shape(record: dict) -> str:
    s = record["shape"]
    return f"{s['prompt_len']}+{s['gen_len']} x {s['batch_size']}"


def _device(record: dict) -> str:
    return (record.get("device") or {}).get("name") or ""


def throughput_table(records: list[dict]) -> pd.DataFrame:
    """ZSMerge Table 1 layout: ``tokens/s / latency s`` (or OOM) per shape and method."""
    rows = {}
    for r in records:
        key = (model_key(r), _device(r), _shape(r))
        if r["status"] == "ok":
            eff = r["efficiency"]
            cell = f"{eff['tokens_per_s']:.1f} / {eff['latency_seconds']:.1f}"
        else:
            cell = r["status"].upper()
        rows.setdefault(key, {})[_label(r)] = cell
    frame = pd.DataFrame.from_dict(rows, orient="index").fillna("")
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=["model", "device", "shape"])
    return frame.sort_index()


def memory_table(records: list[dict]) -> pd.DataFrame:
    """KV bytes held at the end, their buffers, FullKV's for the same tokens, and peak memory (MiB)."""
    rows = []
    for r in records:
        eff = r.get("efficiency") or {}
        rows.append({
            "model": model_key(r), "shape": _shape(r), "method": _label(r),
            "decode tok/s": round(eff["decode_tokens_per_s"], 1) if eff.get("decode_tokens_per_s") else None,
            "KV MiB": round(eff["kv_bytes_end"] / 2**20, 1) if eff else None,
            "buffer MiB": round(eff["allocated_kv_bytes_end"] / 2**20, 1) if eff else None,
            "FullKV MiB": round(eff["fullkv_bytes_end"] / 2**20, 1) if eff else None,
            "peak MiB": round(eff["peak_memory_bytes"] / 2**20) if eff.get("peak_memory_bytes") else None,
            "status": r["status"],
        })  # fmt: skip
    return pd.DataFrame(rows).sort_values(["model", "shape", "method"])


def curve_table(records: list[dict]) -> pd.DataFrame:
    """Context-growth points: decode tokens/s and memory (MiB) per context, one column pair per run."""
    columns = {}
    for r in records:
        for point in r.get("curve") or []:
            row = columns.setdefault(point["context"], {})
            row[f"{_label(r)} tok/s"] = round(point["tokens_per_s"], 1)
            row[f"{_label(r)} KV MiB"] = round(point["kv_bytes"] / 2**20, 1)
            row[f"{_label(r)} mem MiB"] = round(point["memory_bytes"] / 2**20)
    frame = pd.DataFrame.from_dict(columns, orient="index").sort_index()
    frame.index.name = "context"
    return frame


def error_table(records: list[dict]) -> pd.DataFrame:
    """Mean relative attention-output error vs FullKV per budget (ZSMerge Figure 4)."""
    rows = {}
    for r in records:
        analysis = r.get("error_analysis") or {}
        key = (model_key(r), r["task"], _label(r))
        rows[key] = {
            f"budget {b}": f"{m:.3e}" for b, m in zip(analysis["budgets"], analysis["mean"], strict=True)
        }
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=["model", "task", "method"])
    return frame.sort_index()


def oom_table(records: list[dict]) -> pd.DataFrame:
    """Largest batch / context per method and memory cap, with the probes tried."""
    rows = []
    for r in records:
        eff = r["efficiency"]
        cap = eff.get("memory_cap_bytes")
        rows.append({
            "model": model_key(r), "device": r["device"]["type"], "method": _label(r),
            "search": eff["search"], "fixed": _shape(r), "cap GiB": cap / 2**30 if cap else None,
            "threshold": eff["threshold"],
            "probes": " ".join(f"{p['value']}:{p['outcome']}" for p in eff["probes"]),
        })  # fmt: skip
    return pd.DataFrame(rows).sort_values(["model", "search", "method"])


def main(argv: Sequence[str]) -> int:
    """Print every efficiency table the store has records for; bad input (an unknown option, a
    missing store, no efficiency, error or OOM record) is one ``error:`` line, exit 2."""
    return run(_main, argv)


def _main(argv: Sequence[str]) -> int:
    parser = Parser(prog="python -m reports.efficiency", description=__doc__)
    parser.add_argument("results_dir", nargs="?", default=None)
    parser.add_argument("--results-dir", dest="results_dir_opt", default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    args.results_dir = args.results_dir or args.results_dir_opt or default_results_dir()
    records, others = newest_per_setting(open_store(args.results_dir).records())
    runner = {}
    for r in records:
        runner.setdefault(r["config"].get("runner", {}).get("name"), []).append(r)
    measured = [r for name in ("efficiency", "error", "oom") for r in runner.get(name, [])]
    left = left_out.of_rows(row(r) | {"label": _label(r)} for r in measured)
    efficiency = [r for r in runner.get("efficiency", []) if r["status"] != INCOMPLETE]
    finished = [r for r in efficiency if r["status"] == "ok"]
    errors = [r for r in runner.get("error", []) if r["status"] == "ok"]
    ooms = [r for r in runner.get("oom", []) if r["status"] == "ok"]
    curves = [r for r in finished if r.get("curve")]
    tables = [
        ("Throughput (tokens/s / latency s), ZSMerge Table 1", efficiency and throughput_table(efficiency)),
        ("Memory (KVMerger Table 2)", finished and memory_table(finished)),
        ("Context growth (ZSMerge Figure 3)", curves and curve_table(curves)),
        ("Relative attention error vs FullKV (ZSMerge Figure 4)", errors and error_table(errors)),
        ("OOM thresholds", ooms and oom_table(ooms)),
    ]
    tables = [(title, t) for title, t in tables if isinstance(t, pd.DataFrame) and not t.empty]
    if not tables:
        raise KVBenchError(
            f"no efficiency, error or OOM records under {args.results_dir}/runs" + left_out.suffix(left)
        )
    for title, table in tables:
        print(f"\n## {title}\n")
        with pd.option_context("display.width", 220, "display.max_columns", None):
            print(table.to_markdown() if args.markdown else table.to_string())
    for r in [*efficiency, *errors, *ooms]:
        if r["run_id"] in others:
            print(OtherInputs(r["run_id"], _label(r), others[r["run_id"]]).note(), file=sys.stderr)
    for note in left_out.notes(left):
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
