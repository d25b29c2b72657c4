"""RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?", arXiv:2404.06654): its 13 synthetic tasks generated offline at token lengths of the
model's tokenizer, scored as RULER scores them (docs/methods.md, "RULER").

Task settings are RULER's ``scripts/synthetic.yaml``; each sample's haystack is the largest that
keeps ``prompt tokens + tokens to generate <= length``. A sample's ``meta`` keeps the split of its
prompt into context, question and answer prefix (:func:`split`), where kvpress's leaderboard data
(``simonjegou/ruler``) splits it: the question from the newline(s) before it to the blank before
the answer prefix. The prompt's tokens are kvpress's pipeline's (``kvpress/pipeline.py``): the
compressed part and the appended part tokenized apart (:meth:`Ruler.encode`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from tasks.base import Sample, Task
from tasks.chat import pipeline_pieces
from tasks.errors import KVBenchError
from tasks.generators import ruler_data
from tasks.generators.ruler_builders import TASKS, Inputs, builder, haystack_of
from tasks.generators.ruler_text import SENTENCE_SPLITTER, RulerRow, largest_fitting
from tasks.metrics.ruler_metrics import string_match_all, string_match_part
from tasks.options import option

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
        tokenizer's chat template (with ``Task.template_kwargs``) and the answer prefix follows the
        generation prompt, as RULER's chat model templates and kvpress's pipeline do; ``none``: the
        raw text (RULER's ``base``).
    hotpotqa_file : str
        qa_2's file in ``<data_dir>/ruler/`` or an absolute path (the full dev file gives RULER's pool).
    context_tokens : int | None
        The model's context window (``${model.max_context}``).
    query_aware : bool
        False (kvpress's default): the context is compressed, then the question, the end of turn,
        the generation prompt and the answer prefix are appended; True (kvpress's
        ``compress_questions``): the context and the question are compressed, then the rest is
        appended (:meth:`encode`).
    decode_budget : bool | None
        The methods' decoding under this protocol (``Task.decode_budget``): false, the kvpress
        leaderboard's prompt-only rule.
    """

    name: ClassVar[str] = "ruler"
    data_dir: str | None = None
    tasks: str | list[str] = "all"
    lengths: list[int] = field(default_factory=lambda: [4096])
    limit: int | None = option(100, low=1)
    seed: int = 42
    template: str = "base"
    chat_template: str = "auto"
    hotpotqa_file: str = ruler_data.HOTPOTQA
    context_tokens: int | None = None
    query_aware: bool = False
    decode_budget: bool | None = False
    max_new_tokens: int = option(max(TOKENS_TO_GENERATE.values()), low=1)
    source: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.check_fields()
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

    def _pieces(self, tokenizer, context: str, question: str, prefix: str, query_aware: bool):
        if query_aware:  # kvpress's compress_questions: the question joins the compressed context
            context, question = context + question, ""
        kwargs = None if self.chat_template == "none" else self.template_kwargs(tokenizer)
        compressed, appended, special = pipeline_pieces(tokenizer, context, question, prefix, kwargs)
        first = tokenizer(compressed, add_special_tokens=special)["input_ids"]
        return first, tokenizer(appended, add_special_tokens=False)["input_ids"]

    def _count(self, tokenizer, row: RulerRow) -> int:
        """Prompt tokens of ``row``: the longer of its query-agnostic and query-aware tokenizations,
        so both protocols size the same sample within the length."""
        pieces = (row.context, row.question, row.answer_prefix)
        return max(sum(map(len, self._pieces(tokenizer, *pieces, aware))) for aware in (False, True))

    def render(self, tokenizer, sample: Sample) -> tuple[str, bool]:
        """The prompt text (:meth:`encode` tokenizes its two pieces apart)."""
        kwargs = None if self.chat_template == "none" else self.template_kwargs(tokenizer)
        compressed, appended, special = pipeline_pieces(tokenizer, *split(sample), kwargs)
        return compressed + appended, special

    def encode(self, tokenizer, sample: Sample) -> torch.Tensor:
        """Prompt ids ``[1, prompt]`` as kvpress's pipeline builds them (``tasks.chat.pipeline_pieces``):
        the compressed piece (the template up to the end of the context, with ``query_aware`` of the
        question) and the appended piece (the rest, answer prefix last) tokenized apart, joined."""
        first, rest = self._pieces(tokenizer, *split(sample), self.query_aware)
        return torch.tensor([first + rest], dtype=torch.long)

    def chunk_start(self, tokenizer, sample: Sample, ids: torch.Tensor) -> int:
        """The first token of :meth:`encode`'s appended piece: the prefill compresses the tokens
        before it (the context; with ``query_aware`` the context and the question).

        Raises
        ------
        KVBenchError
            If ``ids`` are not the sample's prompt (:meth:`encode`).
        """
        first, rest = self._pieces(tokenizer, *split(sample), self.query_aware)
        if first + rest != ids[0].tolist():
            raise KVBenchError(f"task {self.name}: the ids given for sample {sample.id} are not its prompt")
        return len(first)

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
            meta = {"task": task, "length": length, "index": i}
            meta |= {"context_chars": len(row.context), "question": row.question}
            meta["answer_prefix"] = row.answer_prefix
            sample = Sample(
                id=f"{task}-len{length}-{i}",
                references=row.answers,
                prompt_text=row.text,
                chat_template=self.chat_template == "auto",
                max_new_tokens=budget,
                meta=meta | row.meta,
                question=row.question,
            )
            sample.meta["prompt_tokens"] = self.encode(tokenizer, sample).shape[1]
            samples.append(sample)
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
            "split": "kvpress's: the question from the newline(s) before it to the blank before the answer "
            "prefix; compressed and appended pieces tokenized apart"
            + (" (question compressed with the context)" if self.query_aware else ""),
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
