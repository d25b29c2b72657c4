"""InfiniteBench (Zhang et al., ACL 2024): 12 long-context tasks with the official scorers, under
the ZSMerge prompt protocol (docs/methods.md, "InfiniteBench").

Prompt for every task: ``context + "\\n\\nQuestion: " + input + "\\nAnswer:"`` (no chat template,
options not shown), middle-truncated to ``max_input_tokens`` (100,000 in ZSMerge; capped here so
prompt + answer fit the model's context), greedy, ``max_new_tokens = min(int(1.2 x avg_out) + 2,
1024)``. Rows come from the hub (``xinrongzhang2022/InfiniteBench``, one split per task) or, for
passkey / number_string / kv_retrieval, are generated offline at requested lengths and needle
depths (a needle-in-a-haystack grid).

Context/question split (``query_aware=false``): the question is ``"\\n\\nQuestion: " + input +
"\\nAnswer:"``, the prompt's text after the context (:func:`question_of`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import ClassVar

from tasks.base import Sample, Task
from tasks.data import load_rows
from tasks.errors import KVBenchError
from tasks.generators.infinitebench_synthetic import SYNTHETIC_TASKS, generate
from tasks.metrics.infinitebench_metrics import SCORERS, qa_f1_max
from tasks.options import option

#: Mean answer length per task (tokens) of ZSMerge's ``exam_infiniteBench.py``.
AVG_OUTPUT_TOKENS: dict[str, float] = {
    "passkey": 2, "kv_retrieval": 22.7, "number_string": 4, "code_run": 12, "code_debug": 12,
    "math_find": 1.3, "math_calc": 43900, "longdialogue_qa_eng": 3.4, "longbook_qa_eng": 4800,
    "longbook_sum_eng": 1100, "longbook_choice_eng": 5.3, "longbook_qa_chn": 6.3,
}  # fmt: skip
TASKS: tuple[str, ...] = tuple(AVG_OUTPUT_TOKENS)
#: The fields a row's prompt and label read (``tasks.fields``); the choice tasks also read ``options``.
ROW_SCHEMA = {"context": "text", "input": "string", "answer": "label"}
CHOICE_TASKS = ("code_debug", "longbook_choice_eng")
#: ZSMerge Table 6 columns.
TABLE6 = ("longdialogue_qa_eng", "longbook_choice_eng", "longbook_sum_eng", "math_find", "kv_retrieval",
          "number_string", "passkey", "longbook_qa_chn")  # fmt: skip


def max_new_tokens_for(task: str) -> int:
    """``min(int(1.2 x avg_out) + 2, 1024)``."""
    return min(int(1.2 * AVG_OUTPUT_TOKENS[task]) + 2, 1024)


def question_of(question: str) -> str:
    """The prompt's text after the context: the "Question:" and "Answer:" lines."""
    return f"\n\nQuestion: {question}\nAnswer:"


def render(context: str, question: str) -> str:
    """The ZSMerge prompt: context, then "Question:" and "Answer:" lines (:func:`question_of`)."""
    return context + question_of(question)


def label_of(task: str, row: dict) -> list:
    """The label the scorer expects (official ``get_answer``): ``[text, letter]`` for the
    multiple-choice tasks, the answer list otherwise."""
    answer = row["answer"]
    if task in CHOICE_TASKS:
        answer = answer if isinstance(answer, list) else [answer]
        if len(answer) == 2 and answer[1] in ("A", "B", "C", "D"):
            return list(answer)
        return [answer[0], "ABCD"[list(row["options"]).index(answer[0])]]
    return list(answer) if isinstance(answer, list | tuple) else [answer]


@dataclass
class InfiniteBench(Task):
    """InfiniteBench tasks, from the hub or generated.

    Parameters
    ----------
    tasks : str | list[str]
        Task names or ``all`` (the 12) or ``table6`` (ZSMerge Table 6's eight).
    limit : int | None
        First N rows per task (hub), ignored for generated rows.
    max_input_tokens : int
        Middle-truncation limit (100,000); further capped at ``context_tokens - max_new_tokens``.
    context_tokens : int | None
        The model's context window (``${model.max_context}``).
    generate : bool
        Generate passkey / number_string / kv_retrieval rows offline instead of reading the hub.
    lengths : list[int]
        Prompt lengths (tokens) of the generated grid.
    depths : list[float]
        Needle depths in [0, 1] of the generated grid.
    samples_per_cell : int
        Generated rows per (task, length, depth); row k of cell c has seed ``seed + 1000 c + k``.
    seed : int
    choice_scoring : str
        longbook_choice_eng scorer: ``official`` (letter matching) or ``qa_f1`` (ZSMerge's change).
    answer_tokens : int | None
        Overrides the per-task answer cap (e.g. 16 for a small chat model that first repeats "The
        pass key is" before the digits; the protocol's passkey cap is 4).
    query_aware : bool
        True: the whole prompt is compressed; False (kvpress's protocol): the context is
        compressed, then the question and answer lines are appended (:func:`question_of`).
    """

    name: ClassVar[str] = "infinitebench"
    hub_id: ClassVar[str] = "xinrongzhang2022/InfiniteBench"
    data_dir: str | None = None
    tasks: str | list[str] = "all"
    limit: int | None = option(None, low=1)
    max_input_tokens: int | None = 100_000
    context_tokens: int | None = None
    generate: bool = False
    lengths: list[int] = field(default_factory=lambda: [2000, 4000, 8000])
    depths: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    samples_per_cell: int = 1
    seed: int = 0
    choice_scoring: str = "official"
    answer_tokens: int | None = None
    query_aware: bool = True
    max_new_tokens: int = option(1024, low=1)
    add_special_tokens: bool = True
    source: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.check_fields()
        names = [self.tasks] if isinstance(self.tasks, str) else list(self.tasks)
        expanded: list[str] = []
        for item in names:
            group = {"all": TASKS, "table6": TABLE6}.get(item, (item,))
            expanded += [t for t in group if t not in expanded]
        unknown = [t for t in expanded if t not in AVG_OUTPUT_TOKENS]
        if unknown:
            raise ValueError(
                f"unknown InfiniteBench task(s) {unknown} (tasks: {', '.join(TASKS)}; all; table6)"
            )
        if self.generate and (bad := [t for t in expanded if t not in SYNTHETIC_TASKS]):
            raise ValueError(f"generate=true covers {SYNTHETIC_TASKS} only, not {bad}")
        if self.choice_scoring not in ("official", "qa_f1"):
            raise ValueError(f"task.choice_scoring must be official or qa_f1, got {self.choice_scoring!r}")
        if any(not 0 <= d <= 1 for d in self.depths) or any(n < 1 for n in self.lengths):
            raise ValueError("task.depths must lie in [0, 1] and task.lengths be positive token counts")
        self.selected = expanded
        if self.generate:
            self._check_lengths()

    def _check_lengths(self) -> None:
        """A generated prompt is never shortened: every requested length plus its answer must fit
        the model's context and the truncation limit (else the needle could be cut out while the
        metric still says ``len<L>``).

        Raises
        ------
        ValueError
            Naming the lengths that do not fit and the limit.
        """
        answer = max(self.answer_tokens or max_new_tokens_for(t) for t in self.selected)
        limits = []
        if self.context_tokens:
            limits.append(
                (
                    self.context_tokens - answer,
                    f"the model's context ({self.context_tokens} tokens) less {answer} answer tokens",
                )
            )
        if self.max_input_tokens is not None:
            limits.append((self.max_input_tokens, f"task.max_input_tokens={self.max_input_tokens}"))
        for limit, what in limits:
            if too_long := [n for n in self.lengths if n > limit]:
                raise ValueError(
                    f"task.lengths {too_long} exceed {what}: generated prompts are never truncated; "
                    f"ask for lengths <= {limit}"
                )

    def input_limit(self, sample: Sample) -> int | None:
        """The protocol limit, capped so that prompt + answer fit ``context_tokens``."""
        limits = [x for x in (self.max_input_tokens,) if x is not None]
        if self.context_tokens:
            limits.append(self.context_tokens - self.max_new(sample))
        return min(limits) if limits else None

    def _generated(self, tokenizer) -> list[Sample]:
        if tokenizer is None:
            raise KVBenchError("generated InfiniteBench rows need the model's tokenizer")

        def count(context: str, question: str) -> int:
            return len(
                tokenizer(render(context, question), add_special_tokens=self.add_special_tokens)["input_ids"]
            )

        samples = []
        cells = [(t, n, d) for t in self.selected for n in self.lengths for d in self.depths]
        for cell, (task, tokens, depth) in enumerate(cells):
            for k in range(self.samples_per_cell):
                try:
                    row = generate(task, tokens, depth, self.seed + 1000 * cell + k, count)
                except ValueError as err:  # a length too short for the prompt around one needle
                    raise KVBenchError(f"task.lengths {list(self.lengths)}: {err}") from err
                samples.append(
                    Sample(
                        id=row.id,
                        references=row.answer,
                        prompt_text=render(row.context, row.input),
                        question=question_of(row.input),
                        max_new_tokens=self.answer_tokens or max_new_tokens_for(task),
                        meta={"task": task, "length": tokens, "depth": depth, "label": row.answer},
                    )
                )
        self.source = f"generated (InfiniteBench recipe, seed {self.seed})"
        return samples

    def load(self, tokenizer=None) -> list[Sample]:
        """Generated grid rows, or the first ``limit`` hub rows of every selected task."""
        if self.generate:
            return self._generated(tokenizer)
        samples, sources = [], []
        for task in self.selected:
            rows, where = load_rows(
                self.data_dir, f"infinitebench/{task}.jsonl", self.hub_id, task, self.limit,
                schema=ROW_SCHEMA | ({"options": "texts"} if task in CHOICE_TASKS else {}),
            )  # fmt: skip
            sources.append(where)
            for i, row in enumerate(rows):
                label = label_of(task, row)
                samples.append(
                    Sample(
                        id=f"{task}-{row.get('id', i)}",
                        references=[str(x) for x in label],
                        prompt_text=render(row["context"], row["input"]),
                        question=question_of(row["input"]),
                        max_new_tokens=self.answer_tokens or max_new_tokens_for(task),
                        meta={"task": task, "label": label},
                    )
                )
        self.source = "; ".join(sources)
        return samples

    def protocol(self) -> dict:
        """Prompt format, truncation and scorer choices."""
        return super().protocol() | {
            "benchmark": "InfiniteBench (official compute_scores.py scorers)",
            "prompt": "context + \\n\\nQuestion: + input + \\nAnswer: (ZSMerge), no chat template",
            "chat_template_kwargs": None,
            "context_tokens": self.context_tokens,
            "choice_scoring": self.choice_scoring,
            "answer_tokens": self.answer_tokens or "min(int(1.2 avg_out) + 2, 1024)",
            "generated": self.generate,
        }

    def score_one(self, task: str, prediction: str, label) -> float:
        """The task's official scorer (or QA-F1 for longbook_choice_eng under ``qa_f1``)."""
        if task == "longbook_choice_eng" and self.choice_scoring == "qa_f1":
            return qa_f1_max(prediction, label)
        return SCORERS[task](prediction, label)

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """Per-task 100 x mean, their average, and for generated rows one cell per (task, length, depth).

        Keys: ``avg``, ``<task>``, ``<task>/len<L>/depth<d>``.
        """
        per_sample, by_task, cells = [], {}, {}
        for pred, sample in zip(predictions, samples, strict=True):
            task = sample.meta["task"]
            value = self.score_one(task, pred, sample.meta["label"])
            per_sample.append({"score": 100.0 * value, "task": task})
            by_task.setdefault(task, []).append(value)
            if "depth" in sample.meta:
                key = f"{task}/len{sample.meta['length']}/depth{sample.meta['depth']:g}"
                cells.setdefault(key, []).append(value)
        task_scores = {t: 100 * statistics.fmean(v) for t, v in by_task.items()}
        metrics = {"avg": statistics.fmean(task_scores.values())} | task_scores
        metrics |= {k: 100 * statistics.fmean(v) for k, v in cells.items()}
        return metrics, per_sample
