"""``python -m reports <experiment>``: an experiment's table (Markdown, LaTeX) and figure (PNG, PDF).

What to show comes from the experiment file's ``report`` node (``configs/experiment/<name>.yaml``):

``kind``
    ``table`` (``values`` per ``index`` row and ``columns`` key), ``sensitivity`` (one
    hyperparameter at a time, the ``vary`` sweep), ``curve`` (efficiency curves against the
    context) or ``error`` (attention-output error per budget).
``index``, ``columns``, ``values``
    Keys of a row (config groups by their chosen option, other keys from the stored config,
    e.g. ``budget``, ``runner.batch_size``) and record metrics; a cell is the mean over its runs.
``figure``
    ``{x, y, hue, facet}`` for a line plot of the cell means (``table`` kind).
``paper``
    ``{source, cells}``: the paper's numbers; shown in columns next to ours when the model is the
    same (or ours is random weights of its shape, at any depth: the header says so), otherwise as
    a separate reference table (the paper's model, not ours).
``ratio``
    ``{value, reference}``: each cell's value over the reference cell's (``{method: fullkv}``:
    FullKV in the same setting), beside the paper's ratio, in a table of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from reports import figures, style, tables
from reports import incomplete as left_out
from reports.cells import display_keys, markdown, ordered, stand_in
from reports.context import Context
from reports.frame import job_frame, key_value, near_misses, not_done, report_jobs
from reports.kinds import KINDS
from reports.paired import RESAMPLES
from reports.pairing import Pairing, describe, model_key, pair_frame
from reports.runs import row
from runners.results.sharded import INCOMPLETE, ShardedStore
from runners.results.store import ResultStore, atomic_write_text, setting_of


@dataclass
class Report:
    """A rendered report: Markdown text, the main table, the files written, the figures drawn
    (:class:`~reports.style.Plot`, their matplotlib figures closed but readable), the pairing's
    notes and the extra tables by heading."""

    markdown: str
    table: pd.DataFrame
    files: list[Path] = field(default_factory=list)
    plots: list[style.Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The extra tables under their headings (the ratio to FullKV, paired differences, ...).
    parts: dict[str, pd.DataFrame] = field(default_factory=dict)


def build(
    experiment: str,
    scale: str,
    results_dir: str | Path,
    out_dir: str | Path,
    overrides: Sequence[str] = (),
    baseline: str | None = None,
    n_resamples: int = RESAMPLES,
) -> Report:
    """Render ``experiment`` at ``scale`` from the store under ``results_dir`` into ``out_dir``
    (``<experiment>_<scale>.md``/``.tex``, and ``.png``/``.pdf``/``.csv`` when it has a figure).

    ``overrides`` are the extra command-line overrides the sweep ran with (``seed=0,1,2``: each
    cell then averages the seeds). A table of quality runs is followed by each cell's paired
    difference from FullKV and ``baseline`` (:mod:`reports.experiment_paired`, ``n_resamples``).

    Raises
    ------
    KVBenchError
        For an unknown experiment, or a ``baseline`` without a run on the compared samples.
    """
    store = ShardedStore(results_dir)
    base, jobs, records = report_jobs(experiment, scale, overrides, store)
    spec = base.report
    several_models = len({job.cfg.model.name for job in jobs}) > 1
    index = list(spec.get("index", []))
    if several_models and "model" not in index:
        index = ["model", *index]
    keys = ordered([*index, *(spec.get("columns") or []), "model"])
    frame, pairing = paired(job_frame(jobs, records, keys), records, store)
    stem = Path(out_dir) / f"{experiment}_{scale}"
    models = ordered(frame["model"].map(str))
    title = f"{spec.title} ({scale}: {', '.join(models)})"
    stand_ins = _stand_ins(jobs, records)
    ctx = Context(frame, spec, jobs, records, index, store, title, models, baseline, n_resamples, stand_ins)
    table, plots, extra = KINDS[spec.kind](ctx)
    distinct = frame.drop_duplicates("run_id")
    finished = int(distinct["status"].isin(["ok", UNPAIRED]).sum())
    hue = ctx.hue(index[0]) if index else figures.Hue("")
    lines = [
        f"# {title}",
        "",
        f"Ours: model **{', '.join(models)}**, scale `{scale}`; {finished} of {len(distinct)} distinct runs "
        f"finished ({len(jobs)} sweep jobs); store `{store.root}`. Each cell: the mean over its finished runs"
        + (
            "; FullKV (no budget) is the reference row, repeated under every budget."
            if spec.kind == "table"
            else "."
        ),
        "",
        *(["", *notes] if (notes := _stand_in_notes(spec, stand_ins)) else []),
        "",
        markdown(display_keys(table, hue)),
    ]
    for heading, part in extra:
        lines += ["", f"## {heading}", "", markdown(display_keys(part, hue))]
        lines += ["", part.attrs["caption"]] if part.attrs.get("caption") else []
    missing = not_done(frame[frame["status"] != UNPAIRED])
    lines += ["", "## Missing or failed runs", ""]
    lines.append(markdown(missing) if len(missing) else "none")
    lines += ["", "## Compared samples", ""]
    lines += [f"- {', '.join(group)}: {describe(key)}" for group, key in pairing.samples.items()] or ["none"]
    if pairing.unpaired or pairing.no_reference:
        unpaired = pairing.unpaired_notes()
        lines += ["", "## Not paired", ""] + [f"- {n.removeprefix('note: ')}" for n in unpaired]
    lines += pairing.other_section()
    if finished < len(distinct):
        lines += _near_miss_lines(experiment, scale, overrides, near_misses(jobs, records, store))
    files = []
    for plot in plots:
        plot.stem = stem.name
        files += plot.save(stem.parent)
    if files:
        lines += ["", "Figure: " + ", ".join(f"`{p.name}`" for p in files)]
    text = "\n".join(lines) + "\n"
    atomic_write_text(stem.with_suffix(".md"), text)
    tex = tables.latex(tables.display(display_keys(table, hue)), title, f"tab:{experiment}")
    for heading, part in extra:
        tex += "\n" + tables.latex(tables.display(display_keys(part, hue)), f"{title}: {heading}")
    atomic_write_text(stem.with_suffix(".tex"), tex)
    files = [stem.with_suffix(".md"), stem.with_suffix(".tex"), *files]
    return Report(text, table, files, plots, pairing.notes(), dict(extra))


def _stand_ins(jobs, records: dict[str, dict | None]) -> dict:
    """Our models (by the name the report shows) that stand in for a paper's model
    (:func:`reports.cells.stand_in`), read from each job's record, else its config."""
    out = {}
    for job in jobs:
        record = records.get(job.run_id)
        model = ((record or {}).get("config") or {}).get("model") or job.config.get("model") or {}
        name = str(key_value(job, record, "model"))
        found = stand_in(name, model)
        if found is not None:
            out[name] = found
    return out


def _stand_in_notes(spec, stand_ins: dict) -> list[str]:
    """What differs between each of our stand-in models and the paper model whose cells it stands
    beside (none for a stand-in of a model the paper has no cells of)."""
    cells = spec.paper.cells if spec.get("paper") else []
    cited = {str(cell.get("model")) for cell in cells}
    return [s.note for s in stand_ins.values() if s.paper in cited]


#: The status a finished run gets in a report's frame when it was scored on other samples.
UNPAIRED = "unpaired"


def paired(
    frame: pd.DataFrame, records: dict[str, dict | None], store: ResultStore
) -> tuple[pd.DataFrame, Pairing]:
    """The job frame with each finished run that :func:`reports.pairing.pair` leaves out marked
    ``unpaired`` (its reason in ``error``): cells and figures then skip it, the report lists it.
    A job's run is its setting's newest finished run (``ResultStore.find``); the pairing names the
    setting's runs on other inputs and the jobs whose run is incomplete (shards missing). Runs on
    synthetic prompts (no task) are never paired, never left out."""
    done = frame[frame["status"] == "ok"].drop_duplicates("run_id")
    # runs on synthetic prompts (efficiency, OOM: no task) have no samples to pair on: their
    # batch is a shape (ZSMerge Table 1's batch 4 and 8), never "other samples"
    done = done[
        done["run_id"].map(lambda r: (records[r].get("config") or {}).get("task") is not None).astype(bool)
    ]
    runs = pd.DataFrame(
        {
            "run_id": done["run_id"],
            "model": [model_key(records[r]) for r in done["run_id"]],
            "task": [records[r].get("task") for r in done["run_id"]],
            "method": [records[r].get("method") for r in done["run_id"]],
            "label": [records[r].get("method") for r in done["run_id"]],
            "n": done["n_samples"],
            "other_inputs": [_others(store, r) for r in done["run_id"]],
        }
    )
    pairing = pair_frame(store, runs)
    left = frame[frame["status"] == INCOMPLETE]["run_id"].unique()
    pairing.incomplete = left_out.of_rows(row(records[r]) for r in left)
    reasons = {u.run_id: u.reason for u in pairing.unpaired}
    left = frame["run_id"].isin(reasons)
    frame = frame.assign(
        status=frame["status"].where(~left, UNPAIRED),
        error=frame["error"].where(~left, frame["run_id"].map(reasons)),
    )
    return frame, pairing


def _others(store: ResultStore, rid: str) -> str:
    """The run ids of ``rid``'s setting on other inputs, newest first, space-separated."""
    runs = store.of_setting(setting_of(rid))
    return " ".join(r["run_id"] for r in reversed(runs) if r["run_id"] != rid)


def _near_miss_lines(
    experiment: str, scale: str, overrides: Sequence[str], misses: dict[str, int]
) -> list[str]:
    if not misses:
        return []
    lines = ["", "## Stored runs that differ only by overrides", ""]
    for text, count in misses.items():
        command = " ".join(["python -m reports", experiment, "--scale", scale, *overrides, text])
        lines.append(
            f"- {count} missing job(s) have a finished run with `{text}`: include them with `{command}`"
        )
    return lines
