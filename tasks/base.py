"""The task contract: rows -> samples -> prompt ids -> predictions -> metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from tasks.chat import template_kwargs
from tasks.errors import KVBenchError
from tasks.options import CHAT_TEMPLATE_CHOICES, check_chat_template, check_limit, check_query_aware
from tasks.truncation import kept_question, middle_truncate


@dataclass
class Sample:
    """One evaluation example.

    Exactly one of ``prompt_messages`` (rendered with the model's chat template) and
    ``prompt_text`` (tokenized as is) is set.

    Attributes
    ----------
    id : str
        The dataset's id of the row.
    references : list[str]
        Gold answers (a metric takes the best match over them).
    prompt_messages : list[dict] | None
        Chat messages (``role``/``content``).
    prompt_text : str | None
        A raw prompt; middle-truncated to the task's ``max_input_tokens``, then wrapped in the chat
        template as one user message if ``chat_template`` is set, else tokenized as is.
    chat_template : bool
        See ``prompt_text``.
    max_new_tokens : int | None
        Per-sample generation cap (tokens); None: the task's ``max_new_tokens``.
    stop_strings : tuple[str, ...]
        Extra end-of-generation strings whose single token ends generation (LongBench samsum: "\\n").
    meta : dict
        Anything the scorer needs (subset, length bucket, classes, needle depth ...); stored with
        the prediction.
    question : str | None
        The question part of the prompt text, its leading blanks included: its last occurrence and
        everything after it is what a query-agnostic run appends after compressing the context
        (``Task.question_start``); None for a task without a context/question split.
    """

    id: str
    references: list[str]
    prompt_messages: list[dict] | None = None
    prompt_text: str | None = None
    chat_template: bool = False
    max_new_tokens: int | None = None
    stop_strings: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)
    question: str | None = None


class Task:
    """Base class: a benchmark builds samples, turns them into prompt ids and scores predictions.

    Class attributes
    ----------------
    name : str
        Registry key (the ``name`` of ``configs/task/<name>.yaml``).

    Attributes every task has
    -------------------------
    max_new_tokens : int
        Default generation cap (tokens).
    limit : int | None
        Rows to take (meaning per task: first N, or first N per subset).
    source : str
        Where the rows came from (recorded in the result).
    """

    name: ClassVar[str] = "base"
    max_new_tokens: int
    limit: int | None
    source: str
    #: Tokens of the truncated prompt at most (middle truncation), None for no truncation.
    max_input_tokens: int | None = None
    #: First tokens after which EOS is allowed (LongBench's ``min_length = context + 1`` is 1).
    min_new_tokens: int = 0
    #: Whether a raw ``prompt_text`` is tokenized with the tokenizer's special tokens (BOS).
    add_special_tokens: bool = True
    #: ``auto``: prompts meant for a chat model get the tokenizer's chat template (an ``error:``
    #: line when it has none); ``none``: their text is tokenized raw (base models).
    chat_template: str = "auto"
    #: True: the whole prompt, question included, is prefilled and compressed; False (tasks with a
    #: context/question split): the context is compressed, then the question appended (kvpress's
    #: default, "query-agnostic").
    query_aware: bool = True
    #: What compressing methods do while decoding under this protocol (``decode_budget`` of every
    #: method, ``runners.setup.decode_rule.decode_rule``): None, each method's paper rule; False, the prompt
    #: only (RULER, as the kvpress leaderboard runs it).
    decode_budget: bool | None = None
    #: Keyword arguments of the chat template (``tasks.chat.template_kwargs``): the runner sets them
    #: from ``model.chat_template_kwargs`` (``runners.setup.build.load_prompts``); None: the tokenizer's
    #: default (thinking off where the template reads ``enable_thinking``).
    chat_template_kwargs: dict | None = None

    def check_fields(self, no_split: str | None = None, chat_templates: tuple[str, ...] = ()) -> None:
        """Validate the fields every task has: ``limit`` and ``max_new_tokens`` (:func:`check_limit`),
        ``chat_template`` (:func:`check_chat_template`, among ``chat_templates``; empty: ``auto``,
        ``none``) and ``query_aware`` (:func:`check_query_aware` with ``no_split``).

        Raises
        ------
        ValueError
            For the first field out of range.
        """
        check_limit(self.limit, self.max_new_tokens)
        check_chat_template(self.chat_template, chat_templates or CHAT_TEMPLATE_CHOICES)
        check_query_aware(self.query_aware, no_split)

    def load(self, tokenizer=None) -> list[Sample]:
        """Read (or generate) the samples; local data directory first, hub otherwise.

        Parameters
        ----------
        tokenizer : transformers tokenizer, optional
            Needed by tasks that generate prompts of a requested token length.

        Raises
        ------
        tasks.errors.KVBenchError
            If the data cannot be found.
        """
        raise NotImplementedError

    def max_new(self, sample: Sample) -> int:
        """Generation cap for ``sample`` (tokens)."""
        return sample.max_new_tokens or self.max_new_tokens

    def input_limit(self, sample: Sample) -> int | None:
        """Middle-truncation limit for ``sample``'s raw prompt (tokens); None for none."""
        return self.max_input_tokens

    def template_kwargs(self, tokenizer) -> dict:
        """The variables the chat template is rendered with (:attr:`chat_template_kwargs`, or the
        tokenizer's default: ``tasks.chat.template_kwargs``)."""
        return template_kwargs(tokenizer, self.chat_template_kwargs)

    def render(self, tokenizer, sample: Sample) -> tuple[str, bool]:
        """The prompt as text and whether it is tokenized with the tokenizer's special tokens.

        A raw prompt is middle-truncated to ``max_input_tokens`` first (LongBench/InfiniteBench
        protocol: truncation before the template, as THUDM's ``pred.py``); chat messages get the
        template with the generation prompt and :meth:`template_kwargs` (no special tokens added: the
        template writes them), or
        with ``chat_template="none"`` their contents joined by blank lines (with special tokens).

        Raises
        ------
        tasks.errors.KVBenchError
            If the sample needs a chat template the tokenizer does not have.
        """
        messages = sample.prompt_messages
        if sample.prompt_text is not None:
            text = sample.prompt_text
            if (limit := self.input_limit(sample)) is not None:
                text = middle_truncate(tokenizer, text, limit, self.add_special_tokens)
            if not sample.chat_template:
                return text, self.add_special_tokens
            messages = [{"role": "user", "content": text}]
        if self.chat_template == "none":
            return "\n\n".join(m["content"] for m in messages), True
        if getattr(tokenizer, "chat_template", None) is None:
            name = getattr(tokenizer, "name_or_path", "the model")
            raise KVBenchError(
                f"the tokenizer of {name} has no chat template (a base model?); run with "
                f"task.chat_template=none to give it the raw prompt (recorded in the run's protocol)"
            )
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.template_kwargs(tokenizer)
        )
        return text, False

    def encode(self, tokenizer, sample: Sample) -> torch.Tensor:
        """Prompt ids ``[1, prompt]``: :meth:`render`, tokenized.

        Raises
        ------
        tasks.errors.KVBenchError
            As :meth:`render`.
        """
        text, special = self.render(tokenizer, sample)
        return torch.tensor([tokenizer(text, add_special_tokens=special)["input_ids"]], dtype=torch.long)

    def question_start(self, tokenizer, sample: Sample, ids: torch.Tensor) -> int:
        """Index of the question's first token in the prompt ``ids`` ``[1, prompt]`` (:meth:`encode`):
        a query-agnostic run (``query_aware=false``) compresses the tokens before it (the context)
        and appends the rest (question, answer prefix, the template's generation prompt) after
        compression. The question is the prompt text's last occurrence of ``sample.question``, its
        leading blanks included (kvpress appends the newlines before its question with it; trailing
        blanks may be trimmed by a chat template), or of the part of it that middle
        truncation kept (``tasks.truncation.kept_question``: a question longer than the kept tail
        starts at the seam); a token that straddles its start goes with the question.

        Raises
        ------
        tasks.errors.KVBenchError
            If the task gives the sample no question (no context/question split), or the question
            cannot be found in the rendered prompt or leaves no context before it.
        """
        if not (sample.question or "").strip():
            raise KVBenchError(
                f"task {self.name} has no context/question split (sample {sample.id}); "
                "run it with task.query_aware=true"
            )
        question = sample.question
        if sample.prompt_text is not None and (limit := self.input_limit(sample)) is not None:
            truncated = middle_truncate(tokenizer, sample.prompt_text, limit, self.add_special_tokens)
            question = kept_question(truncated, question)
        text, special = self.render(tokenizer, sample)
        at = text.rfind(question.rstrip())
        enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
        if at < 0 or enc["input_ids"] != ids[0].tolist():
            raise KVBenchError(f"task {self.name}: the question of sample {sample.id} is not in its prompt")
        start = next(i for i, (_, end) in enumerate(enc["offset_mapping"]) if end > at)
        if start < 1:
            raise KVBenchError(f"task {self.name}: sample {sample.id} has no context before its question")
        return start

    def chunk_start(self, tokenizer, sample: Sample, ids: torch.Tensor) -> int | None:
        """The first token of the prompt ``ids`` ``[1, prompt]`` that is appended after the prefill
        compressed the tokens before it: the question's (:meth:`question_start`) in a query-agnostic
        run; None in a query-aware one, which compresses the whole prompt (the protocols of LongBench
        and InfiniteBench, whose question ends the prompt or its user message; RULER overrides this).

        Raises
        ------
        tasks.errors.KVBenchError
            As :meth:`question_start`.
        """
        return None if self.query_aware else self.question_start(tokenizer, sample, ids)

    def protocol(self) -> dict:
        """The protocol facts recorded with every result (template and its variables, truncation,
        EOS set ...)."""
        return {
            "chat_template_mode": self.chat_template,
            "chat_template_kwargs": None if self.chat_template == "none" else self.chat_template_kwargs,
            "max_input_tokens": self.max_input_tokens,
            "min_new_tokens": self.min_new_tokens,
            "add_special_tokens": self.add_special_tokens,
            "query_aware": self.query_aware,
        }

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """Aggregate metrics and per-sample metric dicts for the predictions."""
        raise NotImplementedError
