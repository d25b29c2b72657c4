"""Which stored runs a report may compare: one run per setting, and runs of one model and task
scored on the same samples.

Every report reads the store's records through :func:`newest_per_setting`: a setting run on several
inputs (another model file, changed data; the run id is ``<setting id>-<inputs hash>``) is one run,
the newest finished, and the others are named in a note ("also run on other inputs"), never pooled.
Every comparison (the ``budget``, ``pareto`` and ``niah`` figures, ``summary``, ``reports.compare``
and the experiment tables) goes through :func:`pair`. Within each (model, task) it picks the
sample set most of the compressed runs were scored on, keeps the runs scored on exactly those
samples (sample ids from ``predictions.jsonl``, docs/results.md) and takes the FullKV run on the same
samples as the reference. Every other run is returned as :class:`Unpaired` with the reason, which
the reports print (a ``note:`` line) and write into the caption or the Markdown: a run is never
compared on other samples, and never dropped without a word.

Only FullKV is a reference: a method that ignores the budget (KVMerger at a fixed theta) is placed
at the fraction of the prompt it kept (:func:`reports.runs.row`), never drawn or ranked as one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from reports import incomplete as left_out
from runners.results.store import ResultStore, by_age, newest, setting_of

#: Registry names of the methods that are the reference of a comparison (the uncompressed cache).
REFERENCE_METHODS = frozenset({"fullkv"})
#: The keys a comparison is made within: runs of other models or tasks are never compared.
PAIR_KEYS = ("model", "task")

SampleKey = frozenset | str  # the sample ids of a run, or a description where none are recorded


def model_key(record: dict) -> str:
    """The model a run is compared within (runs of two models are never compared): the record's
    ``config.model.name``. The one place reports derive a run's model from its record."""
    return str(((record.get("config") or {}).get("model") or {}).get("name") or "")


def is_reference(method: object) -> bool:
    """Whether runs of ``method`` (a registry name) are the reference of a comparison (FullKV)."""
    return str(method) in REFERENCE_METHODS


def sample_ids(store: ResultStore, run_id: str) -> frozenset[str] | None:
    """The ids of the samples a run scored (``predictions.jsonl``'s ``id``); None without them."""
    path = store.run_dir(run_id) / "predictions.jsonl"
    if not path.is_file():
        return None
    ids = [json.loads(line).get("id") for line in path.read_text(encoding="utf-8").splitlines() if line]
    return frozenset(str(i) for i in ids) if ids and None not in ids else None


def sample_key(store: ResultStore, run_id: str, n: object) -> SampleKey:
    """What a run's samples are compared by: their ids, or where the run recorded none (older
    records, synthetic prompts) the text ``"<n> samples, ids not recorded"``."""
    ids = sample_ids(store, run_id)
    if ids is not None:
        return ids
    return "sample ids not recorded" if n is None or n != n else f"{int(n)} samples, ids not recorded"


def describe(key: SampleKey) -> str:
    """A sample key for people: ``2 samples (ids 0, 1)``, ids shortened beyond six."""
    if isinstance(key, str):
        return key
    ids = sorted(key, key=lambda i: (len(i), i))
    shown = ", ".join(ids[:6]) + (", ..." if len(ids) > 6 else "")
    return f"{len(ids)} samples (ids {shown})"


def newest_per_setting(records: Sequence[dict]) -> tuple[list[dict], dict[str, str]]:
    """The records reports show: one per setting (:func:`runners.results.store.newest`: the newest finished,
    else the newest), in the order of ``records``; and, for each shown run whose setting has other
    runs (on other inputs: changed data, another model file), their run ids, newest first,
    space-separated."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(setting_of(record["run_id"]), []).append(record)
    shown, others = set(), {}
    for group in groups.values():
        chosen = newest(group)
        shown.add(chosen["run_id"])
        rest = [r["run_id"] for r in reversed(by_age(group)) if r is not chosen]
        if rest:
            others[chosen["run_id"]] = " ".join(rest)
    return [r for r in records if r["run_id"] in shown], others


@dataclass(frozen=True)
class OtherInputs:
    """A shown run whose setting was also run on other inputs (runs not shown, not pooled)."""

    run_id: str
    label: str
    others: str

    def ids(self) -> str:
        """The other run ids, comma-separated."""
        return ", ".join(self.others.split())

    def note(self) -> str:
        """One line for the console and the Markdown."""
        shown = f"{self.label} (run {self.run_id}, newest finished)"
        return f"note: {shown}: also run on other inputs: {self.ids()}"


def other_inputs(runs: pd.DataFrame) -> list[OtherInputs]:
    """The :class:`OtherInputs` of the rows of ``runs`` (``run_id``, ``label``, ``other_inputs``)."""
    if "other_inputs" not in runs:
        return []
    found = runs[runs["other_inputs"].fillna("").astype(bool)].drop_duplicates("run_id")
    return [OtherInputs(r.run_id, str(r.label), r.other_inputs) for r in found.itertuples()]


@dataclass(frozen=True)
class Unpaired:
    """A run a report could not compare, and why."""

    run_id: str
    label: str
    samples: str
    reason: str

    def note(self) -> str:
        """One line for the console, the caption and the Markdown."""
        return f"not paired: {self.label} (run {self.run_id[:8]}): {self.reason}"


@dataclass
class Pairing:
    """The result of :func:`pair`: the run ids compared, the sample set of each (model, task)
    group, the runs left out with reasons, and groups without a FullKV reference."""

    kept: list[str] = field(default_factory=list)
    samples: dict[tuple, SampleKey] = field(default_factory=dict)
    unpaired: list[Unpaired] = field(default_factory=list)
    no_reference: list[tuple] = field(default_factory=list)
    other_inputs: list[OtherInputs] = field(default_factory=list)
    incomplete: list[left_out.Incomplete] = field(default_factory=list)

    def unpaired_notes(self) -> list[str]:
        """Console lines: every unpaired run and every group compared without FullKV."""
        lines = [u.note() for u in self.unpaired]
        lines += [f"note: no FullKV run on the compared samples of {', '.join(g)}" for g in self.no_reference]
        return [line if line.startswith("note:") else f"note: {line}" for line in lines]

    def other_notes(self) -> list[str]:
        """Console lines: every run whose setting was also run on other inputs."""
        return list(dict.fromkeys(o.note() for o in self.other_inputs))

    def notes(self) -> list[str]:
        """:meth:`unpaired_notes`, :meth:`other_notes` and the incomplete runs left out."""
        return self.unpaired_notes() + self.other_notes() + left_out.notes(self.incomplete)

    def other_section(self) -> list[str]:
        """Markdown lines naming the runs on other inputs (``## Also run on other inputs``) and the
        incomplete runs left out (``## Left out: incomplete runs``), or none."""
        notes = [f"- {n.removeprefix('note: ')}" for n in self.other_notes()]
        other = ["", "## Also run on other inputs", "", *notes] if notes else []
        return other + left_out.section(self.incomplete)

    def merge(self, other: Pairing) -> None:
        """Add ``other``'s runs, sample sets and notes (a report paired in several parts)."""
        self.kept += other.kept
        self.samples |= other.samples
        self.unpaired += other.unpaired
        self.no_reference += other.no_reference
        self.other_inputs += other.other_inputs
        self.incomplete = list(dict.fromkeys(self.incomplete + other.incomplete))

    def caption(self, brief: bool = False) -> str:
        """One sentence for a caption: the samples compared, and how many runs were left out;
        ``brief``: the runs on other samples by label only (a long list, named in full elsewhere)."""
        sets = {describe(k) for k in self.samples.values()}
        text = f"Runs paired on the same samples: {'; '.join(sorted(sets))}." if sets else ""
        if self.unpaired:
            named = (u.label if brief else f"{u.label} on {u.samples}" for u in self.unpaired)
            runs = "; ".join(dict.fromkeys(named))
            text += f" Not paired (other samples): {runs}."
        for o in dict.fromkeys(self.other_inputs):
            text += f" {o.label} (run {o.run_id}) also run on other inputs: {o.ids()}."
        return (text + left_out.caption(self.incomplete)).strip()


def pair(runs: pd.DataFrame, keys: Mapping[str, SampleKey], by: Sequence[str] = PAIR_KEYS) -> Pairing:
    """Split runs into those a report compares and those it cannot.

    Parameters
    ----------
    runs : pandas.DataFrame
        One row per run with columns ``run_id``, ``method`` (registry name), ``label`` (display)
        and the ``by`` columns (model, task); ``reference`` (optional, else FullKV by ``method``)
        marks the reference runs (``reports.runs.row``: FullKV over unquantized storage); with
        ``other_inputs`` (:func:`newest_per_setting`) the runs of their settings on other inputs
        are named in the notes, and so are the incomplete runs the frame carries
        (:func:`reports.incomplete.attached`).
    keys : Mapping[str, SampleKey]
        The sample key of each run id (:func:`sample_key`).
    by : Sequence[str]
        The columns whose values a comparison never mixes.

    Returns
    -------
    Pairing
        Per ``by`` group, the sample set of most compressed runs (ties: the most samples) and the
        runs on it, FullKV included; every other run is unpaired with its reason. A group of only
        FullKV runs keeps the one on the most samples.
    """
    out = Pairing(other_inputs=other_inputs(runs), incomplete=left_out.attached(runs))
    if runs.empty:
        return out
    for group, part in runs.groupby(list(by), sort=False, dropna=False):
        group = tuple(str(g) for g in (group if isinstance(group, tuple) else (group,)))
        reference = (
            part["reference"].astype(bool) if "reference" in part else part["method"].map(is_reference)
        )
        methods = part[~reference]
        pool = methods if len(methods) else part
        counts = Counter(keys[rid] for rid in pool["run_id"])
        chosen = max(counts, key=lambda k: (counts[k], _size(k), describe(k)))
        out.samples[group] = chosen
        has_reference = False
        for run, is_ref in zip(part.itertuples(), reference, strict=True):
            key = keys[run.run_id]
            if key == chosen:
                out.kept.append(run.run_id)
                has_reference |= bool(is_ref)
                continue
            why = f"scored on {describe(key)}; the compared runs of {', '.join(group)} on {describe(chosen)}"
            shared = len(key & chosen) if not isinstance(key, str) and not isinstance(chosen, str) else 0
            if shared:
                why += f" ({shared} shared)"
            out.unpaired.append(Unpaired(run.run_id, str(run.label), describe(key), why))
        if len(methods) and not has_reference:
            out.no_reference.append(group)
    return out


def _size(key: SampleKey) -> int:
    if isinstance(key, str):
        head = key.split(" ", 1)[0]
        return int(head) if head.isdigit() else 0
    return len(key)


def pair_frame(store: ResultStore, runs: pd.DataFrame, by: Sequence[str] = PAIR_KEYS) -> Pairing:
    """:func:`pair` with each run's sample key read from the store (``runs`` needs an ``n`` column)."""
    keys = {r.run_id: sample_key(store, r.run_id, r.n) for r in runs.itertuples()}
    return pair(runs, keys, by)
