"""RULER's shared pieces: the task templates, the generated row, our sentence splitter and the search
that sizes a haystack to a token length (NVIDIA/RULER, Hsieh et al. 2024, arXiv:2404.06654).

Templates are RULER's ``scripts/data/synthetic/constants.py`` split at ``{context}``: a template is
``head + context + tail + answer_prefix`` (the ``base`` model template ``{task_template}`` adds
nothing around it). The row keeps the context part and the question part apart, so that a caller
can compress the context alone and append the question afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.generators.fit import bisect_fitting

#: family -> (head, tail, answer_prefix); ``{type_needle_v}``, ``{query}``, ``{num_v}`` are filled
#: per sample (cwe and fwe format ``query=''``, a no-op).
TEMPLATES: dict[str, tuple[str, str, str]] = {
    "niah": (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
        "memorize it. I will quiz you about the {type_needle_v} afterwards.\n",
        "\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    ),
    "vt": (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n",
        "\nQuestion: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
        "variables are assgined the value {query}, they are: ",
    ),
    "cwe": (
        "Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often.\n",
        "\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
    ),
    "fwe": (
        "Read the following coded text and track the frequency of each coded word. Find the three "
        "most frequently appeared coded words. ",
        "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
        "most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
    ),
    "qa": (
        "Answer the question based on the given documents. Only give me the answer and do not output "
        "any other words.\n\nThe following are given documents.\n\n",
        "\n\nAnswer the question based on the given documents. Only give me the answer and do not "
        "output any other words.\n\nQuestion: {query}",
        " Answer:",
    ),
}

#: The noise line of the ``noise`` haystack (niah, vt).
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclass
class RulerRow:
    """One generated sample: ``context + question + answer_prefix`` is RULER's ``input``, split where
    kvpress's leaderboard data splits it (``answer_prefix`` from its first word).

    Attributes
    ----------
    context : str
        Everything up to the end of the haystack (instructions before it, few-shot example).
    question : str
        The template's text after the haystack (the question, from the newline(s) before it), and
        the blank that separates it from the answer prefix.
    answer_prefix : str
        RULER's answer prefix from its first word, the start of the answer the model continues.
    answers : list[str]
        RULER's ``outputs`` (every one must appear in the prediction; qa: any one).
    meta : dict
        Geometry of the haystack: needle lines / depths, gold documents, units used.
    """

    context: str
    question: str
    answer_prefix: str
    answers: list[str]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Move the answer prefix's leading blank to the end of the question (RULER's templates start
        the prefix with it; kvpress's question ends with it)."""
        stripped = self.answer_prefix.lstrip()
        self.question += self.answer_prefix[: len(self.answer_prefix) - len(stripped)]
        self.answer_prefix = stripped

    @property
    def text(self) -> str:
        """The whole raw prompt (RULER's ``input`` under the ``base`` template)."""
        return self.context + self.question + self.answer_prefix


# Our sentence splitter (RULER uses NLTK punkt, which needs a downloaded model). A word ends a
# sentence when it ends in . ! or ? (closing quotes/brackets allowed after it), is not a known
# abbreviation or a single-letter initial, and the next word starts with a capital letter, a digit
# or an opening quote/bracket.
SENTENCE_SPLITTER = "kvbench-words-v1 (end punctuation + capitalised next word, abbreviation list)"
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf al inc ltd co corp no fig vol approx dept est "
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m ph.d".split()
)
_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*$")
_START = re.compile(r"[\"'\u201c\u2018(\[]*[A-Z0-9]")


def split_sentences(text: str) -> list[str]:
    """Sentences of a single-spaced text; ``" ".join(split_sentences(t)) == t`` for such a text.

    Source: ours (``SENTENCE_SPLITTER``), standing in for RULER's ``nltk.sent_tokenize``.
    """
    words = text.split(" ")
    sentences, start = [], 0
    for i, word in enumerate(words[:-1]):
        if _END.search(word) and _START.match(words[i + 1]):
            stem = word.rstrip("\"'\u201d\u2019)]").rstrip(".!?").lower()
            if stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha()):
                continue
            sentences.append(" ".join(words[start : i + 1]))
            start = i + 1
    sentences.append(" ".join(words[start:]))
    return [s for s in sentences if s]


def largest_fitting(fits: Callable[[int], bool], least: int, most: int, start: int | None = None) -> int:
    """The largest ``n`` in ``[least, most]`` with ``fits(n)`` (``fits`` monotone: true then false).

    RULER searches the haystack size the same way (an incremental or binary search on the token
    count); here a galloping search from ``start`` (a previous sample's size), then bisection.

    Raises
    ------
    ValueError
        If even ``least`` does not fit.
    """
    if not fits(least):
        raise ValueError("does not fit")
    lo, hi = least, None
    if start is not None and least < start <= most:
        if fits(start):
            lo = start
        else:
            hi = start
    step = max(1, lo // 32 if start is not None else lo)
    while hi is None:
        n = min(most, lo + step)
        if n == lo:
            return lo
        if fits(n):
            lo, step = n, step * 2
        else:
            hi = n
    return bisect_fitting(fits, lo, hi)
