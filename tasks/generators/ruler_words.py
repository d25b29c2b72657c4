"""RULER's aggregation tasks: common words extraction (cwe) and frequent words extraction (fwe)
(NVIDIA/RULER ``scripts/data/synthetic/common_words_extraction.py``, ``freq_words_extraction.py``).

cwe: a numbered list where 10 common words appear ``freq_cw`` times and the others ``freq_ucw``
times (6 and 1 below 4K tokens), after one solved example (40 words, 10 / 3 repeats; below 4K:
20 words, 3 / 1). fwe: 6-letter coded words with Zipf(``alpha``) counts, the top-ranked one
replaced by "..." (noise); the answer is ranks 2-4.
"""

from __future__ import annotations

import random
import string

from scipy.special import zeta

from tasks.generators.ruler_text import TEMPLATES, RulerRow

COMMON = 10


def _word_list(rng: random.Random, pool: tuple[str, ...], words: int, common: int, uncommon: int):
    chosen = rng.sample(pool, words)
    listed = chosen[:COMMON] * common + chosen[COMMON:] * uncommon
    rng.shuffle(listed)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), chosen[:COMMON]


def build_cwe(
    units: int, seed: str, pool: tuple[str, ...], length: int, freq_cw: int = 30, freq_ucw: int = 3
) -> RulerRow:
    """A cwe row with ``units`` distinct words in the list.

    Parameters
    ----------
    pool : tuple[str, ...]
        Candidate words (RULER: wonderwords' sorted set shuffled with the seed; english_words
        when ``units`` exceeds it).
    length : int
        Requested length (tokens): below 4096 RULER lowers the repeats.

    Returns
    -------
    RulerRow
        ``answers``: the 10 common words; ``meta``: ``units``, ``repeats`` (common, uncommon).
    """
    rng = random.Random(seed)
    head, tail, prefix = TEMPLATES["cwe"]
    if length < 4096:
        (ex_words, ex_common, ex_uncommon), (common, uncommon) = (20, 3, 1), (6, 1)
    else:
        (ex_words, ex_common, ex_uncommon), (common, uncommon) = (40, 10, 3), (freq_cw, freq_ucw)
    ex_context, ex_answer = _word_list(rng, pool, ex_words, ex_common, ex_uncommon)
    shown = " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_answer))
    solved = head + ex_context + tail + prefix + shown
    context, answer = _word_list(rng, pool, units, common, uncommon)
    meta = {"units": units, "repeats": [common, uncommon]}
    return RulerRow(solved + "\n" + head + context, tail, prefix, answer, meta)


def build_fwe(units: int, seed: str, length: int, alpha: float = 2.0, word_length: int = 6) -> RulerRow:
    """An fwe row: ``int(units * k^-alpha / zeta(alpha))`` copies of the rank-k coded word.

    The vocabulary has ``length // 50`` words (RULER's default ``vocab_size``).

    Returns
    -------
    RulerRow
        ``answers``: the coded words of ranks 2-4; ``meta``: ``units``, ``vocab``.
    """
    rng = random.Random(seed)
    size = length // 50
    vocab = {"".join(rng.choices(string.ascii_lowercase, k=word_length)) for _ in range(size)}
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=word_length)))
    ranked = sorted(vocab)
    rng.shuffle(ranked)
    ranked[0] = "..."
    norm = float(zeta(alpha))
    text = [w for k, w in enumerate(ranked, start=1) for _ in range(int(units * k**-alpha / norm))]
    rng.shuffle(text)
    head, tail, prefix = TEMPLATES["fwe"]
    return RulerRow(head + " ".join(text), tail, prefix, ranked[1:4], {"units": units, "vocab": size})
