"""RULER's task table and one builder per family: for a task at a length, ``build(units, seed,
index)`` and the bounds of the haystack-size search, over the inputs of
:mod:`tasks.generators.ruler_data` (NVIDIA/RULER ``scripts/synthetic.yaml``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.errors import KVBenchError
from tasks.generators import ruler_data, ruler_niah, ruler_qa, ruler_vt, ruler_words
from tasks.generators.ruler_niah import NiahConfig
from tasks.generators.ruler_text import RulerRow

#: task -> (family, niah settings or None), in RULER's order.
TASKS: dict[str, tuple[str, NiahConfig | None]] = {
    "niah_single_1": ("niah", NiahConfig("noise")),
    "niah_single_2": ("niah", NiahConfig("essay")),
    "niah_single_3": ("niah", NiahConfig("essay", type_needle_v="uuids")),
    "niah_multikey_1": ("niah", NiahConfig("essay", num_needle_k=4)),
    "niah_multikey_2": ("niah", NiahConfig("needle")),
    "niah_multikey_3": ("niah", NiahConfig("needle", type_needle_k="uuids", type_needle_v="uuids")),
    "niah_multivalue": ("niah", NiahConfig("essay", num_needle_v=4)),
    "niah_multiquery": ("niah", NiahConfig("essay", num_needle_q=4)),
    "vt": ("vt", None),
    "cwe": ("cwe", None),
    "fwe": ("fwe", None),
    "qa_1": ("qa", None),
    "qa_2": ("qa", None),
}
OTHER_HAYSTACKS = {
    "vt": "noise",
    "cwe": "wonderwords words",
    "fwe": "coded words",
    "qa_1": "squad",
    "qa_2": "hotpotqa",
}
VT_HOPS = 4
#: No haystack reaches this many units (noise lines, distractor needles, coded words).
UNBOUNDED = 10**7


def haystack_of(task: str) -> str:
    """The haystack of a task, as recorded in the protocol."""
    niah = TASKS[task][1]
    return niah.haystack if niah is not None else OTHER_HAYSTACKS[task]


@dataclass
class Builder:
    """How to build one task's samples at one length.

    Attributes
    ----------
    build : callable
        ``build(units, seed, index)`` -> :class:`RulerRow` with ``units`` haystack units.
    least : callable
        ``least(index)``: the fewest units sample ``index`` can have.
    most : int
        The most units the inputs hold.
    wider : callable | None
        ``wider()`` -> a larger ``most`` from a second pool, for when ``most`` units still fit.
    """

    build: Callable[[int, str, int], RulerRow]
    least: Callable[[int], int]
    most: int
    wider: Callable[[], int] | None = None


@dataclass
class Inputs:
    """RULER's input files as one run reads them, and what it records about them.

    Attributes
    ----------
    sources : dict[str, str]
        Input name -> where it was read from.
    pools : dict[str, dict]
        qa task -> ``questions``, ``documents`` and ``file`` of its pool.
    """

    data_dir: str | None
    seed: int
    hotpotqa_file: str
    limit: int
    sources: dict[str, str] = field(default_factory=dict)
    pools: dict[str, dict] = field(default_factory=dict)
    _cwe: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def cwe_pool(self, units: int) -> tuple[str, ...]:
        """cwe's words: wonderwords' nouns, adjectives and verbs (a sorted set shuffled with the
        seed), or english_words.json shuffled the same way once ``units`` exceeds them (RULER)."""
        if "small" not in self._cwe:
            lists, self.sources["wonderwords"] = ruler_data.wonderwords(self.data_dir)
            self._cwe["small"] = self._shuffled(set(lists["noun"] + lists["adjective"] + lists["verb"]))
        if units <= len(self._cwe["small"]):
            return self._cwe["small"]
        if "english" not in self._cwe:
            self._cwe["english"] = self._shuffled(ruler_data.english_words(self.data_dir))
        return self._cwe["english"]

    def _shuffled(self, words) -> tuple[str, ...]:
        ordered = sorted(words)
        random.Random(self.seed).shuffle(ordered)
        return tuple(ordered)


def niah(inputs: Inputs, task: str, length: int, tokenizer) -> Builder:
    """Noise lines, distractor needles or essay words (``least``: room for the needles)."""
    cfg = TASKS[task][1]
    lists, inputs.sources["wonderwords"] = ruler_data.wonderwords(inputs.data_dir)
    words = (tuple(sorted(set(lists["adjective"]))), tuple(sorted(set(lists["noun"]))))
    essay: tuple[str, ...] = ()
    if cfg.haystack == "essay":
        essay, inputs.sources["essays"] = ruler_data.essay_words(inputs.data_dir)
    needles = max(cfg.num_needle_k, cfg.num_needle_q) * cfg.num_needle_v
    least, most = (1, len(essay)) if essay else (needles, UNBOUNDED)
    return Builder(lambda n, s, i: ruler_niah.build(cfg, n, s, words, essay), lambda i: least, most)


def vt(inputs: Inputs, task: str, length: int, tokenizer) -> Builder:
    """Noise lines after the solved example (sized with ``tokenizer``); at least one per assignment."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    example = ruler_vt.example(f"{inputs.seed}-vt-example", VT_HOPS, count)
    return Builder(lambda n, s, i: ruler_vt.build(n, s, VT_HOPS, example), lambda i: VT_HOPS + 1, UNBOUNDED)


def cwe(inputs: Inputs, task: str, length: int, tokenizer) -> Builder:
    """Distinct words of the list (at least the 10 common ones); english_words widens the pool."""
    most = len(inputs.cwe_pool(1))
    build = lambda n, s, i: ruler_words.build_cwe(n, s, inputs.cwe_pool(n), length)  # noqa: E731
    return Builder(build, lambda i: ruler_words.COMMON, most, lambda: len(inputs.cwe_pool(most + 1)))


def fwe(inputs: Inputs, task: str, length: int, tokenizer) -> Builder:
    """The Zipf word count ``units`` (the text holds the integer parts of its shares)."""
    return Builder(lambda n, s, i: ruler_words.build_fwe(n, s, length), lambda i: 1, UNBOUNDED)


def qa(inputs: Inputs, task: str, length: int, tokenizer) -> Builder:
    """Documents of sample i's question i (at least its gold ones).

    Raises
    ------
    KVBenchError
        When ``limit`` exceeds the file's questions.
    """
    if task == "qa_1":
        questions, docs, where = ruler_data.squad(inputs.data_dir)
    else:
        questions, docs, where = ruler_data.hotpotqa(inputs.data_dir, inputs.hotpotqa_file)
    inputs.sources[task] = where
    inputs.pools[task] = {"questions": len(questions), "documents": len(docs), "file": where}
    if inputs.limit > len(questions):
        raise KVBenchError(
            f"task.limit={inputs.limit} exceeds the {len(questions)} questions of {task}'s file "
            f"({where}); RULER's sample i asks question i"
        )
    build = lambda n, s, i: ruler_qa.build(n, s, questions[i], docs, inputs.seed)  # noqa: E731
    return Builder(build, lambda i: len(questions[i]["gold"]), len(docs))


#: family -> builder factory ``(inputs, task, length, tokenizer) -> Builder``.
BUILDERS: dict[str, Callable[[Inputs, str, int, object], Builder]] = {
    "niah": niah, "vt": vt, "cwe": cwe, "fwe": fwe, "qa": qa,
}  # fmt: skip


def builder(inputs: Inputs, task: str, length: int, tokenizer) -> Builder:
    """The :class:`Builder` of ``task`` at ``length`` tokens (``tokenizer`` sizes vt's example).

    Raises
    ------
    KVBenchError
        For missing input files, or a ``limit`` beyond a qa file's questions.
    """
    return BUILDERS[TASKS[task][0]](inputs, task, length, tokenizer)
