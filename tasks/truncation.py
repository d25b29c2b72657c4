"""Middle truncation of long prompts (LongBench ``pred.py``, InfiniteBench, ZSMerge App. C.3/C.4)."""

from __future__ import annotations


def middle_truncate(tokenizer, text: str, max_tokens: int, add_special_tokens: bool = True) -> str:
    """Keep the first and last ``max_tokens // 2`` tokens of ``text``, drop the middle.

    The LongBench recipe: tokenize (with special tokens), and if longer than ``max_tokens`` join
    ``decode(ids[:half])`` and ``decode(ids[-half:])`` (special tokens skipped), ``half =
    int(max_tokens / 2)``. Re-tokenizing the joined text can merge tokens at the seam and come out
    a few tokens longer; then both halves shrink by the overshoot until the result fits, so the
    limit always holds (the official code can exceed it by a few tokens).

    Parameters
    ----------
    tokenizer : transformers tokenizer
    text : str
        The prompt.
    max_tokens : int
        Limit in tokens (counted with ``add_special_tokens``).
    add_special_tokens : bool
        Whether the prompt will be tokenized with BOS (as the official scripts do).

    Returns
    -------
    str
        ``text`` itself if it fits, else head + tail.

    Raises
    ------
    ValueError
        If ``max_tokens`` < 2.
    """
    if max_tokens < 2:
        raise ValueError(f"max_input_tokens must be >= 2, got {max_tokens}")
    ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    half = int(max_tokens / 2)
    while True:
        head = tokenizer.decode(ids[:half], skip_special_tokens=True)
        tail = tokenizer.decode(ids[-half:], skip_special_tokens=True)
        joined = head + tail
        over = len(tokenizer(joined, add_special_tokens=add_special_tokens)["input_ids"]) - max_tokens
        if over <= 0 or half <= 1:
            return joined
        half -= max(1, (over + 1) // 2)


def kept_question(truncated: str, question: str) -> str:
    """The part of a prompt's question that middle truncation kept.

    ``question`` ends the raw prompt (the text after the context, ``Sample.question``). If the
    truncated prompt still ends with it, leading blanks included (trailing ones aside), it is
    returned as is; otherwise the truncation cut into it (a question longer than the kept tail,
    e.g. LongBench repobench-p's in-file code under a small ``max_input_tokens``, or a seam in its
    leading blanks) and what survives is the longest common suffix of ``truncated`` and
    ``question``: the tail after the seam. A query-agnostic run then appends that part after
    compressing the rest.

    Parameters
    ----------
    truncated : str
        The prompt after :func:`middle_truncate` (before any chat template).
    question : str
        The question, a suffix of the prompt before truncation.

    Returns
    -------
    str
        ``question``, or its suffix that ``truncated`` ends with (``question`` itself when that
        suffix is blank, so the caller reports the question as missing).
    """
    if truncated.rstrip().endswith(question.rstrip()):
        return question
    n, limit = 0, min(len(truncated), len(question))
    while n < limit and truncated[-1 - n] == question[-1 - n]:
        n += 1
    kept = question[len(question) - n :]
    return kept if kept.strip() else question
