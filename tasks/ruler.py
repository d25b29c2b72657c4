"""RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?", arXiv:2404.06654): its 13 synthetic tasks generated offline at token lengths of the
model's tokenizer, scored as RULER scores them (docs/methods.md, "RULER").

Task settings are RULER's ``scripts/synthetic.yaml``; each sample's haystack is the largest that
keeps ``prompt tokens + tokens to generate <= length``. A sample's ``meta`` keeps the split of its
prompt into context, question and answer prefix (:func:`split`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from tasks.base import Sample, Task, check_chat_template, check_limit, check_query_aware
from tasks.errors import KVBenchError
from tasks.generators import ruler_data
from tasks.generators.ruler_builders import TASKS, Inputs, builder, haystack_of
from tasks.generators.ruler_text import SENTENCE_SPLITTER, RulerRow, largest_fitting
from tasks.metrics.ruler_metrics import string_match_all, string_match_part

#: RULER's ``tokens_to_generate`` per family.
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}
METRICS: dict[str, Callable[[str, list[str]], float]] = {
    "niah": string_match_all, "vt": string_match_all, "cwe": string_match_all, "fwe": string_match_all,
    "qa": string_match_part,
}  # fmt: skip
QA = ("qa_1", "qa_2")
#: RULER's samples per task (``config_tasks.sh``): what ``limit: null`` asks for.
RULER_SAMPLES = 500


def split(sample: Sample) -> tuple[str, str, str]:
    """``(context, question, answer_prefix)`` of a RULER sample; their concatenation is its prompt."""
    text, prefix = sample.prompt_text, sample.meta["answer_prefix"]
    end = sample.meta["context_chars"]
    return text[:end], text[end : len(text) - len(prefix)], prefix


@dataclass
class Ruler(Task):
    """RULER's 13 tasks at ``lengths`` tokens, ``limit`` samples per task and length.

    Parameters
    ----------
    tasks : str | list[str]
        Task names or ``all``.
    lengths : list[int]
        Sequence lengths (tokens, prompt + tokens to generate, as RULER's ``max_seq_length``);
        at most ``context_tokens``.
    limit : int | None
        Samples per task and length (null: RULER's 500); sample i of qa asks the file's question i.
    seed : int
        Seeds every sample (``random.Random(f"{seed}-{task}-{length}-{i}")``).
    template : str
        RULER's model template: ``base`` (the task template as is).
    chat_template : str
        ``auto``: the task template (without the answer prefix) is the user message of the
        tokenizer's chat template and the answer prefix follows the generation prompt, as RULER's
        chat model templates do; ``none``: the raw text (RULER's ``base``).
    hotpotqa_file : str
        qa_2's file in ``<data_dir>/ruler/`` or an absolute path (the full dev file gives RULER's pool).
    context_tokens : int | None
        The model's context window (``${model.max_context}``).
    query_aware : bool
        False (kvpress's default): the context is compressed, then the question and answer prefix
        are appended; True: the whole prompt is compressed (``Task.question_start``).
    """

    name: ClassVar[str] = "ruler"
    data_dir: str | None = None
    tasks: str | list[str] = "all"
    lengths: list[int] = field(default_factory=lambda: [4096])
    limit: int | None = 100
    seed: int = 42
    template: str = "base"
    chat_template: str = "auto"
    hotpotqa_file: str = ruler_data.HOTPOTQA
    context_tokens: int | None = None
    query_aware: bool = False
    max_new_tokens: int = max(TOKENS_TO_GENERATE.values())
    source: str = field(default="", init=False)

    def __post_init__(self) -> None:
        check_limit(self.limit, self.max_new_tokens)
        check_chat_template(self.chat_template)
        check_query_aware(self.query_aware)
        names = [self.tasks] if isinstance(self.tasks, str) else list(self.tasks)
        self.selected = [t for t in TASKS if t in names or "all" in names]
        if unknown := [t for t in names if t not in TASKS and t != "all"]:
            raise ValueError(f"unknown RULER task(s) {unknown} (tasks: {', '.join(TASKS)}; all)")
        if self.template != "base":
            raise ValueError(f"task.template must be base (RULER's base template), got {self.template!r}")
        lengths = list(self.lengths)
        if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths):
            raise ValueError(f"task.lengths must be positive token counts, got {lengths}")
        if self.context_tokens and (too_long := [n for n in lengths if n > self.context_tokens]):
            raise ValueError(
                f"task.lengths {too_long} exceed the model's context ({self.context_tokens} tokens); "
                f"ask for lengths <= {self.context_tokens}"
            )
        self.limit = RULER_SAMPLES if self.limit is None else self.limit
        self.inputs = Inputs(self.data_dir, self.seed, self.hotpotqa_file, self.limit)
        self.tokenizer_name = None

    def _text(self, tokenizer, context: str, question: str, prefix: str) -> tuple[str, bool]:
        if self.chat_template == "none":
            return context + question + prefix, True
        messages = [{"role": "user", "content": context + question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text + prefix, False

    def _count(self, tokenizer, row: RulerRow) -> int:
        text, special = self._text(tokenizer, row.context, row.question, row.answer_prefix)
        return len(tokenizer(text, add_special_tokens=special)["input_ids"])

    def render(self, tokenizer, sample: Sample) -> tuple[str, bool]:
        """The prompt text: the raw text (with special tokens), or the chat template around context
        + question followed by the answer prefix (``chat_template=auto``)."""
        return self._text(tokenizer, *split(sample))

    def sample_seed(self, task: str, length: int, index: int) -> str:
        """The seed of one sample (``random.Random`` hashes a string seed with SHA-512: stable)."""
        return f"{self.seed}-{task}-{length}-{index}"

    def row(self, tokenizer, task: str, length: int, index: int, units: int) -> RulerRow:
        """Sample ``index`` of ``task`` at ``length`` built with ``units`` haystack units (what the
        sizing search evaluates; the sample itself has the largest ``units`` that fit)."""
        build = builder(self.inputs, task, length, tokenizer).build
        return build(units, self.sample_seed(task, length, index), index)

    def _generate(self, task: str, length: int, tokenizer) -> list[Sample]:
        family = TASKS[task][0]
        budget = TOKENS_TO_GENERATE[family]
        make = builder(self.inputs, task, length, tokenizer)
        build, least, most = make.build, make.least, make.most
        samples, units = [], None
        for i in range(self.limit):
            seed = self.sample_seed(task, length, i)

            def fits(n: int, seed=seed, i=i) -> bool:
                row = build(n, seed, i)
                return self._count(tokenizer, row) + budget <= length

            try:
                units = largest_fitting(fits, least(i), most, units)
            except ValueError as err:
                raise KVBenchError(
                    f"task.lengths: {task} does not fit in {length} tokens (its prompt around the "
                    f"smallest haystack + {budget} tokens to generate is longer); ask for a longer length"
                ) from err
            if units == most and make.wider is not None:
                most = make.wider()
                units = largest_fitting(fits, least(i), most, units)
            if units == most:
                raise KVBenchError(
                    f"{task}: its whole pool ({most} units) is shorter than {length} tokens; "
                    "ask for a shorter length"
                )
            row = build(units, seed, i)
            meta = {"task": task, "length": length, "index": i, "prompt_tokens": self._count(tokenizer, row)}
            meta |= {"context_chars": len(row.context), "question": row.question}
            meta["answer_prefix"] = row.answer_prefix
            samples.append(
                Sample(
                    id=f"{task}-len{length}-{i}",
                    references=row.answers,
                    prompt_text=row.text,
                    chat_template=self.chat_template == "auto",
                    max_new_tokens=budget,
                    meta=meta | row.meta,
                    question=row.question,
                )
            )
        return samples

    def load(self, tokenizer=None) -> list[Sample]:
        """Generate ``limit`` samples per selected task and length.

        Raises
        ------
        KVBenchError
            Without a tokenizer, without a chat template under ``auto``, for missing data, or for a
            length too short for a task (or longer than its pool).
        """
        if tokenizer is None:
            raise KVBenchError("RULER samples are sized with the model's tokenizer")
        if self.chat_template == "auto" and getattr(tokenizer, "chat_template", None) is None:
            name = getattr(tokenizer, "name_or_path", "the model")
            raise KVBenchError(
                f"the tokenizer of {name} has no chat template (a base model?); run with "
                f"task.chat_template=none to give it RULER's raw base-template prompt"
            )
        self.tokenizer_name = getattr(tokenizer, "name_or_path", None)
        samples = []
        for length in self.lengths:
            for task in self.selected:
                samples += self._generate(task, length, tokenizer)
        files = "; ".join(sorted(set(self.inputs.sources.values())))
        self.source = f"generated (RULER recipe, seed {self.seed})" + (f" from {files}" if files else "")
        return samples

    def protocol(self) -> dict:
        """Templates, sizes, seed, tokenizer, sentence splitter and the qa pools."""
        return super().protocol() | {
            "benchmark": "RULER (NVIDIA/RULER synthetic.yaml; string_match_all / string_match_part)",
            "template": self.template,
            "chat_template": "tokenizer's (task template as user message, answer prefix after the "
            "generation prompt)"
            if self.chat_template == "auto"
            else "none (raw base-template text with special tokens)",
            "seed": self.seed,
            "lengths": list(self.lengths),
            "sizing": "largest haystack with prompt tokens + tokens to generate <= length",
            "tokenizer": self.tokenizer_name,
            "tokens_to_generate": {t: TOKENS_TO_GENERATE[TASKS[t][0]] for t in self.selected},
            "haystack": {t: haystack_of(t) for t in self.selected},
            "sentence_splitter": SENTENCE_SPLITTER,
            "qa_pools": {t: pool for t, pool in self.inputs.pools.items() if t in QA},
            "data": dict(self.inputs.sources),
        }

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """RULER's metric per task (x 100, averaged over lengths) and their average ``avg``; with
        several lengths also ``<task>/len<L>`` and ``avg/len<L>``."""
        per_sample, cells = [], {}
        for pred, sample in zip(predictions, samples, strict=True):
            task, length = sample.meta["task"], sample.meta["length"]
            value = METRICS[TASKS[task][0]](pred, sample.references)
            per_sample.append({"score": 100.0 * value, "task": task})
            cells.setdefault((task, length), []).append(value)
        tasks = [t for t in TASKS if any(k[0] == t for k in cells)]
        lengths = sorted({k[1] for k in cells})
        by_cell = {k: 100 * statistics.fmean(v) for k, v in cells.items()}
        by_task = {t: statistics.fmean(by_cell[k] for k in by_cell if k[0] == t) for t in tasks}
        metrics = {"avg": statistics.fmean(by_task.values())} | by_task
        if len(lengths) > 1:
            for n in lengths:
                metrics[f"avg/len{n}"] = statistics.fmean(by_cell[(t, n)] for t in tasks)
                metrics |= {f"{t}/len{n}": by_cell[(t, n)] for t in tasks}
        return metrics, per_sample
