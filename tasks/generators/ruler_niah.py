"""RULER's needle-in-a-haystack family (NVIDIA/RULER ``scripts/data/synthetic/niah.py``).

Needles "One of the special magic {type_needle_v} for {key} is: {value}." go into one of three
haystacks: ``noise`` (the noise line repeated, lines joined by newlines; needles at random lines),
``essay`` (the Paul Graham essays; needles at sentence boundaries at depths drawn from 40 evenly
spaced points in 0-100%) or ``needle`` (distractor needles with random keys and values). The query
asks for the values of ``num_needle_q`` of the ``num_needle_k`` keys.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from tasks.generators.ruler_text import NOISE, TEMPLATES, RulerRow, split_sentences

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
#: np.round(np.linspace(0, 100, 40)).astype(int): the essay needle depths (percent).
DEPTHS = tuple(round(100 * i / 39) for i in range(40))


@dataclass(frozen=True)
class NiahConfig:
    """One niah task of RULER's ``synthetic.yaml``.

    Attributes
    ----------
    haystack : str
        ``noise``, ``essay`` or ``needle``.
    type_needle_k, type_needle_v : str
        ``words`` (adjective-noun), ``numbers`` (7 digits) or ``uuids``.
    num_needle_k, num_needle_v, num_needle_q : int
        Keys, values per key, and keys queried (keys are at least the queries).
    """

    haystack: str
    type_needle_k: str = "words"
    type_needle_v: str = "numbers"
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1


def _random(kind: str, rng: random.Random, words: tuple[tuple[str, ...], tuple[str, ...]]) -> str:
    """A key or value: an adjective-noun pair (uniform over the distinct pairs), 7 digits or a uuid4."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjectives, nouns = words
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _singular(text: str) -> str:
    """RULER's rewrite of the template when one value is asked for."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(old, new)
    return text


def build(
    cfg: NiahConfig,
    units: int,
    seed: str,
    words: tuple[tuple[str, ...], tuple[str, ...]],
    essay: tuple[str, ...],
) -> RulerRow:
    """A niah row with ``units`` haystack units (noise lines, distractor needles or essay words).

    Parameters
    ----------
    words : tuple
        Sorted unique adjectives and nouns (wonderwords lists).
    essay : tuple[str, ...]
        The essay haystack's words (used by ``essay`` only).

    Returns
    -------
    RulerRow
        ``meta``: ``needles`` (in context order), ``lines`` (noise/needle: their line numbers) or
        ``depths`` (essay: their depths in percent of the sentences), ``units``.
    """
    rng = random.Random(seed)
    num_k = max(cfg.num_needle_k, cfg.num_needle_q)
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(_random(cfg.type_needle_k, rng, words))
        values.append([_random(cfg.type_needle_v, rng, words) for _ in range(cfg.num_needle_v)])
        needles += [NEEDLE.format(type_needle_v=cfg.type_needle_v, key=keys[-1], value=v) for v in values[-1]]
    rng.shuffle(needles)
    meta: dict = {"units": units}
    if cfg.haystack == "essay":
        sentences = split_sentences(" ".join(essay[:units]).strip())
        depths = sorted(rng.sample(DEPTHS, len(needles)))
        cuts = [0] + [int(len(sentences) * d / 100) for d in depths] + [len(sentences)]
        pieces = []
        for i in range(1, len(cuts)):
            pieces.append(" ".join(sentences[cuts[i - 1] : cuts[i]]))
            if i - 1 < len(needles):
                pieces.append(needles[i - 1])
        haystack = " ".join(pieces)
        meta |= {"depths": depths, "sentences": len(sentences)}
    else:
        if cfg.haystack == "noise":
            lines = [NOISE] * units
        else:
            lines = [
                NEEDLE.format(
                    type_needle_v=cfg.type_needle_v,
                    key=_random(cfg.type_needle_k, rng, words),
                    value=_random(cfg.type_needle_v, rng, words),
                )
                for _ in range(units)
            ]
        at = sorted(rng.sample(range(units), len(needles)), reverse=True)
        for index, needle in zip(at, needles, strict=False):
            lines.insert(index, needle)
        # inserted from the last position down: the r-th lowest index ends r lines further
        meta["lines"] = [index + r for r, index in enumerate(sorted(at))]
        needles = [needles[at.index(index)] for index in sorted(at)]
        haystack = "\n".join(lines)
    meta["needles"] = needles
    queried = rng.sample(range(num_k), cfg.num_needle_q)
    queries = [keys[i] for i in queried]
    answers = [v for i in queried for v in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    head, tail, prefix = TEMPLATES["niah"]
    type_v = cfg.type_needle_v
    if cfg.num_needle_q * cfg.num_needle_v == 1:
        head, tail, prefix = map(_singular, (head, tail, prefix))
        type_v = type_v[:-1]
    fill = {"type_needle_v": type_v, "query": query}
    return RulerRow(head.format(**fill) + haystack, tail.format(**fill), prefix.format(**fill), answers, meta)
