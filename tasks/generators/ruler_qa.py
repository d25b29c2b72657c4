"""RULER's question answering over many documents (NVIDIA/RULER ``scripts/data/synthetic/qa.py``).

Sample i asks question i (file order). Its documents: the gold ones first, then the other
paragraphs of the same article (SQuAD), then random documents of the whole file; shown as
"Document {i}:\\n{document}", separated by blank lines, in RULER's order: its line
``random.Random(args.random_seed).shuffle(all_docs)`` shuffles every sample's list with a fresh
generator of the run's seed, so the permutation depends only on the document count and the gold
documents land at the same places in every sample of that count (the only gold document of qa_1
9th of 10, 19th of 20, 28th of 30 at seed 42).
"""

from __future__ import annotations

import random

from tasks.generators.ruler_text import TEMPLATES, RulerRow

DOCUMENT = "Document {i}:\n{document}"


def build(units: int, seed: str, question: dict, docs: tuple[str, ...], order_seed: int) -> RulerRow:
    """A qa row with ``units`` documents (all of the file's when ``units >= len(docs)``).

    Parameters
    ----------
    units : int
        Documents in the context.
    seed : str
        The sample's seed: which other documents are drawn.
    question : dict
        ``query``, ``outputs``, ``gold`` and ``more`` (document indices), as
        :func:`tasks.generators.ruler_data.squad` builds it.
    docs : tuple[str, ...]
        The file's documents.
    order_seed : int
        RULER's ``random_seed`` (the task's ``seed``): the documents are ordered by
        ``random.Random(order_seed).shuffle``, the same permutation for every sample of a count.

    Returns
    -------
    RulerRow
        ``meta``: ``gold_documents`` (their 1-based numbers in the context), ``units``.

    Raises
    ------
    ValueError
        If ``units`` is smaller than the question's gold documents.
    """
    gold, more = question["gold"], question["more"]
    if units < len(gold):
        raise ValueError(f"a question needs its {len(gold)} gold documents")
    rng = random.Random(seed)
    if units >= len(docs):
        chosen = list(range(len(docs)))
    elif units - len(gold) > len(more):
        taken = set(gold) | set(more)
        others = [i for i in range(len(docs)) if i not in taken]
        chosen = gold + more + rng.sample(others, units - len(gold) - len(more))
    else:
        chosen = gold + rng.sample(more, units - len(gold))
    random.Random(order_seed).shuffle(chosen)
    context = "\n\n".join(DOCUMENT.format(i=n + 1, document=docs[d]) for n, d in enumerate(chosen))
    head, tail, prefix = TEMPLATES["qa"]
    numbers = sorted({n + 1 for n, d in enumerate(chosen) if d in set(gold)})
    meta = {"gold_documents": numbers, "units": units}
    question_text = tail.format(query=question["query"])
    return RulerRow(head + context, question_text, prefix, list(question["outputs"]), meta)
