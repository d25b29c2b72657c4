"""LongBench (Bai et al. 2024, THUDM/LongBench): 21 long-context subsets with their official metrics.

Protocol (docs/methods.md, "LongBench"): prompt from the ``dataset2prompt`` table, middle truncation of
the prompt to a per-model ``max_input_tokens``, greedy decoding with ``dataset2maxlen`` new tokens
and at least one token (``min_length = context + 1``), first-line post-processing for
trec/triviaqa/samsum/lsht, per-example max over references, per-subset 100 x mean. Both protocol
tables are read from data files (``longbench/dataset2prompt.json``, ``dataset2maxlen.json``), never
retyped. LongBench-E subsets (``<name>_e``) are also scored per length bucket.

Context/question split (``query_aware=false``): the question is the template's text after
``{context}`` (instruction, ``{input}`` and answer prefix), filled (:func:`question_of`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tasks.base import Sample, Task
from tasks.data import load_rows, read_jsonl
from tasks.errors import KVBenchError
from tasks.metrics.longbench_metrics import METRICS
from tasks.options import option

#: ZSMerge Table 3 categories (verified against its Table 5).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "CODE": ("lcc", "repobench-p"),
    "FSHOT": ("trec", "triviaqa", "samsum", "lsht"),
    "MDQA": ("hotpotqa", "2wikimqa", "musique", "dureader"),
    "SDQA": ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh"),
    "SUMM": ("gov_report", "qmsum", "multi_news", "vcsum"),
    "SYNC": ("passage_count", "passage_retrieval_en", "passage_retrieval_zh"),
}
SUBSETS: tuple[str, ...] = tuple(name for names in CATEGORIES.values() for name in names)
#: THUDM ``eval.py`` ``dataset2metric``.
SUBSET_METRIC: dict[str, str] = {
    "narrativeqa": "qa_f1", "qasper": "qa_f1", "multifieldqa_en": "qa_f1", "multifieldqa_zh": "qa_f1_zh",
    "hotpotqa": "qa_f1", "2wikimqa": "qa_f1", "musique": "qa_f1", "dureader": "rouge_zh",
    "gov_report": "rouge", "qmsum": "rouge", "multi_news": "rouge", "vcsum": "rouge_zh",
    "trec": "classification", "triviaqa": "qa_f1", "samsum": "rouge", "lsht": "classification",
    "passage_retrieval_en": "retrieval", "passage_count": "count", "passage_retrieval_zh": "retrieval_zh",
    "lcc": "code_sim", "repobench-p": "code_sim",
}  # fmt: skip
#: Subsets whose prediction is cut to its first line before scoring.
FIRST_LINE: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht"})
#: Subsets THUDM never wraps in a chat template (few-shot and code completion).
NO_CHAT_TEMPLATE: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})
#: LongBench-E length buckets (by the row's ``length`` field, words).
BUCKETS: tuple[tuple[str, int], ...] = (("0-4k", 4000), ("4-8k", 8000), ("8k+", 10**12))
CHAT_TEMPLATE_MODES = ("thudm", "none", "all")
#: The fields a row's prompt and scorer read (``tasks.fields``); ``input`` is empty in the
#: summarisation subsets.
ROW_SCHEMA = {"context": "text", "input": "string", "answers": "texts"}


def base_subset(name: str) -> str:
    """``qasper_e`` -> ``qasper``."""
    return name.removesuffix("_e")


def resolve_subsets(selection: str | list[str], local: list[str]) -> list[str]:
    """Expand names, category names (CODE, FSHOT, MDQA, SDQA, SUMM, SYNC), "all" and "local".

    Raises
    ------
    ValueError
        For an unknown name.
    """
    items = [selection] if isinstance(selection, str) else list(selection)
    out: list[str] = []
    for item in items:
        if item == "all":
            names = list(SUBSETS)
        elif item == "local":
            names = local
        elif item.upper() in CATEGORIES:
            names = list(CATEGORIES[item.upper()])
        elif base_subset(item) in SUBSET_METRIC:
            names = [item]
        else:
            raise ValueError(
                f"unknown LongBench subset {item!r} (subsets: {', '.join(SUBSETS)}; "
                f"categories: {', '.join(CATEGORIES)}; or all/local; LongBench-E: <subset>_e)"
            )
        out += [n for n in names if n not in out]
    return out


def question_of(template: str, row: dict) -> str | None:
    """The question part of a ``dataset2prompt`` prompt: the template's text after its (last)
    ``{context}``, filled from ``row``; the filled template ends with it.

    Returns None (no context/question split) when the template has no ``{context}``, nothing but
    blanks after it, or its ``{input}`` before it.
    """
    head, found, tail = template.rpartition("{context}")
    if not found or not tail.strip() or "{input}" in head:
        return None
    return tail.format(**row)


def first_line(prediction: str) -> str:
    """``pred.lstrip('\\n').split('\\n')[0]``."""
    return prediction.lstrip("\n").split("\n")[0]


def score_example(subset: str, prediction: str, references: list[str], all_classes) -> float:
    """Max over references of the subset's metric (after first-line cutting where LongBench does)."""
    base = base_subset(subset)
    if base in FIRST_LINE:
        prediction = first_line(prediction)
    metric = METRICS[SUBSET_METRIC[base]]
    return max([0.0] + [metric(prediction, ref, all_classes) for ref in references])


@dataclass
class LongBench(Task):
    """LongBench and LongBench-E subsets.

    Parameters
    ----------
    data_dir : str | None
        Local data directory: rows are taken from every ``longbench/*.jsonl`` by their ``dataset``
        field (or file name); subsets not there come from the hub (``THUDM/LongBench``, test split).
    subsets : str | list[str]
        Names, categories, ``all`` (21), ``local`` (those in the data directory), ``<name>_e``.
    limit : int | None
        First N rows per subset.
    max_input_tokens : int
        Middle-truncation limit (tokens); per model (``model.longbench_max_input_tokens``).
    chat_template : str
        ``thudm`` (template for chat models except trec/triviaqa/samsum/lsht/lcc/repobench-p),
        ``none`` (KVCache-Factory @7ee6be0), or ``all``.
    samsum_newline_eos : bool
        Stop samsum at the first newline token (THUDM ``pred.py``; KVCache-Factory @7ee6be0: no).
    tables_dir : str | None
        Directory of ``dataset2prompt.json`` / ``dataset2maxlen.json`` (default
        ``<data_dir>/longbench``).
    query_aware : bool
        True: the whole prompt is compressed; False (kvpress's protocol): the context is
        compressed, then the template's text after ``{context}`` is appended (:func:`question_of`).
    """

    name: ClassVar[str] = "longbench"
    hub_id: ClassVar[str] = "THUDM/LongBench"
    data_dir: str | None = None
    subsets: str | list[str] = "all"
    limit: int | None = option(None, low=1)
    max_input_tokens: int | None = 7500
    chat_template: str = "thudm"
    samsum_newline_eos: bool = True
    tables_dir: str | None = None
    query_aware: bool = True
    max_new_tokens: int = option(512, low=1)
    min_new_tokens: int = 1
    source: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.check_fields(chat_templates=CHAT_TEMPLATE_MODES)
        if self.max_input_tokens is not None and self.max_input_tokens < 2:
            raise ValueError(f"task.max_input_tokens must be >= 2, got {self.max_input_tokens}")
        self.local = self._local_rows()
        self.selected = resolve_subsets(self.subsets, sorted(self.local))
        if not self.selected:
            raise ValueError("task.subsets selects no LongBench subset (subsets=local needs local files)")

    def _local_rows(self) -> dict[str, list[dict]]:
        """Rows per subset found under ``<data_dir>/longbench`` (file order, duplicates by _id dropped)."""
        rows: dict[str, list[dict]] = {}
        folder = Path(self.data_dir).expanduser() / "longbench" if self.data_dir else None
        if folder is None or not folder.is_dir():
            return rows
        seen: set[str] = set()
        for path in sorted(folder.glob("*.jsonl")):
            for row in read_jsonl(path, schema=ROW_SCHEMA):
                key = row.get("_id") or json.dumps(row, sort_keys=True)[:200]
                if key in seen:
                    continue
                seen.add(key)
                subset = row.get("dataset") or path.stem
                if path.stem.endswith("_e") and not subset.endswith("_e"):
                    subset += "_e"
                rows.setdefault(subset, []).append(row)
        return rows

    def _tables(self) -> tuple[dict[str, str], dict[str, int]]:
        folder = Path(self.tables_dir or Path(self.data_dir or ".") / "longbench").expanduser()
        tables = []
        for name in ("dataset2prompt.json", "dataset2maxlen.json"):
            try:
                tables.append(json.loads((folder / name).read_text(encoding="utf-8")))
            except FileNotFoundError as err:
                raise KVBenchError(
                    f"missing data: LongBench protocol table {err.filename} (THUDM/LongBench config/; "
                    "set KVBENCH_DATA_DIR or task.tables_dir)"
                ) from err
            except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                raise KVBenchError(f"{folder / name}: not a UTF-8 JSON table ({err})") from err
        return tables[0], tables[1]

    def uses_chat_template(self, subset: str) -> bool:
        """Whether ``subset``'s prompt is wrapped in the chat template under this protocol."""
        if self.chat_template == "thudm":
            return base_subset(subset) not in NO_CHAT_TEMPLATE
        return self.chat_template == "all"

    def load(self, tokenizer=None) -> list[Sample]:
        """The first ``limit`` rows of every selected subset, prompts built from the tables."""
        prompts, maxlen = self._tables()

        samples: list[Sample] = []
        sources = []
        for subset in self.selected:
            if subset in self.local:
                rows = self.local[subset][: self.limit] if self.limit else self.local[subset]
                where = f"{self.data_dir}/longbench"
            else:
                rows, where = load_rows(None, "", self.hub_id, "test", self.limit, subset, ROW_SCHEMA)
            sources.append(f"{subset}:{where}")
            base = base_subset(subset)
            for i, row in enumerate(rows):
                samples.append(
                    Sample(
                        id=str(row.get("_id") or f"{subset}-{i}"),
                        references=list(row["answers"]),
                        prompt_text=prompts[base].format(**row),
                        question=question_of(prompts[base], row),
                        chat_template=self.uses_chat_template(subset),
                        max_new_tokens=int(maxlen[base]),
                        stop_strings=("\n",) if base == "samsum" and self.samsum_newline_eos else (),
                        meta={
                            "subset": subset,
                            "length": row.get("length"),
                            "all_classes": row.get("all_classes"),
                        },
                    )
                )
        self.source = "; ".join(sources)
        return samples

    def protocol(self) -> dict:
        """Template mode, truncation limit, EOS additions and minimum length."""
        return super().protocol() | {
            "benchmark": "LongBench (THUDM eval.py metrics)",
            "chat_template": self.chat_template,
            "samsum_newline_eos": self.samsum_newline_eos,
            "subsets": self.selected,
        }

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """Per-subset scores (100 x mean, 2 decimals), LongBench-E buckets, categories, average.

        Keys: ``avg`` (mean over the subsets), ``<subset>``, ``<subset>/<bucket>`` for ``_e``
        subsets, ``cat/<CATEGORY>`` (mean over the category's selected subsets).
        """
        per_sample = []
        by_subset: dict[str, list[float]] = {}
        buckets: dict[tuple[str, str], list[float]] = {}
        for pred, sample in zip(predictions, samples, strict=True):
            subset = sample.meta["subset"]
            value = score_example(subset, pred, sample.references, sample.meta.get("all_classes"))
            per_sample.append({"score": 100.0 * value, "subset": subset})
            by_subset.setdefault(subset, []).append(value)
            if subset.endswith("_e"):
                length = sample.meta.get("length") or 0
                bucket = next(label for label, upper in BUCKETS if length < upper)
                buckets.setdefault((subset, bucket), []).append(value)
        subset_scores = {s: round(100 * statistics.fmean(v), 2) for s, v in by_subset.items()}
        metrics: dict[str, float] = {"avg": round(statistics.fmean(subset_scores.values()), 2)}
        metrics |= subset_scores
        metrics |= {f"{s}/{b}": round(100 * statistics.fmean(v), 2) for (s, b), v in buckets.items()}
        for cat, names in CATEGORIES.items():
            present = [subset_scores[s] for s in subset_scores if base_subset(s) in names]
            if present:
                metrics[f"cat/{cat}"] = round(statistics.fmean(present), 2)
        return metrics, per_sample
