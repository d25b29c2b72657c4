"""The external files RULER's generators read, from ``<data_dir>/ruler/`` (docs/data.md), with the
hub (SQuAD v2, HotpotQA) or the ``wonderwords`` package as fall-backs.

Every loader returns the data and a description of where it came from (recorded in the result),
and raises :class:`tasks.errors.KVBenchError` with one line naming the file when neither source can
be read or the file does not hold what RULER reads from it (text where text is expected:
``tasks.fields``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from tasks.errors import KVBenchError
from tasks.fields import check_row, check_value

ESSAYS = "PaulGrahamEssays.json"
SQUAD = "squad_dev_v2.json"
HOTPOTQA = "hotpotqa_dev_first100.json"
WONDERWORDS = "wonderwords_2.2.0"
ENGLISH_WORDS = "english_words.json"


def _local(data_dir: str | None, name: str) -> Path | None:
    """``name`` as given if absolute, else ``<data_dir>/ruler/<name>``; None when absent."""
    path = Path(name).expanduser()
    if not path.is_absolute():
        if not data_dir:
            return None
        path = Path(data_dir).expanduser() / "ruler" / name
    return path if path.exists() else None


def _missing(data_dir: str | None, name: str, fallback: str) -> KVBenchError:
    where = Path(data_dir or "<data_dir unset>") / "ruler" / name
    return KVBenchError(f"missing data: {where} not found and {fallback}")


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KVBenchError(f"{path}: not a valid UTF-8 JSON file ({err})") from err


@contextmanager
def _layout(where: object, what: str) -> Iterator[None]:
    """A file (or hub dataset) ``where`` read in the body that is not laid out as ``what`` (a key
    missing, a list where an object belongs) is one error line naming it."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as err:
        raise KVBenchError(f"{where}: not {what} ({type(err).__name__}: {err})") from err


@cache
def essay_words(data_dir: str | None) -> tuple[tuple[str, ...], str]:
    """The essay haystack: the essays' text, whitespace collapsed, split on spaces (RULER niah.py).

    Raises
    ------
    KVBenchError
        If the file is absent (RULER builds it with a download script; no hub copy), or is not a
        JSON object whose ``text`` is a non-empty string.
    """
    path = _local(data_dir, ESSAYS)
    if path is None:
        raise _missing(data_dir, ESSAYS, "it has no hub equivalent (set KVBENCH_DATA_DIR)")
    text = check_row(_read_json(path), {"text": "text"}, str(path))["text"]
    return tuple(re.sub(r"\s+", " ", text).split(" ")), str(path.resolve())


@cache
def wonderwords(data_dir: str | None) -> tuple[dict[str, tuple[str, ...]], str]:
    """The noun, adjective and verb lists of wonderwords 2.2.0 (file order, duplicates kept).

    Falls back to an installed ``wonderwords`` package's assets (3.x drops 4 nouns).

    Raises
    ------
    KVBenchError
        If neither the directory nor the package is there, or a list cannot be read or holds no word.
    """
    names = ("noun", "adjective", "verb")
    folder = _local(data_dir, WONDERWORDS)
    if folder is None:
        try:
            from importlib.metadata import version
            from importlib.resources import files

            folder, where = files("wonderwords") / "assets", f"wonderwords {version('wonderwords')} package"
        except (ImportError, ModuleNotFoundError) as err:
            raise _missing(data_dir, WONDERWORDS, "the wonderwords package is not installed") from err
    else:
        where = str(Path(folder).resolve())
    lists = {}
    for name in names:
        path = folder / f"{name}list.txt"
        try:
            lists[name] = tuple(w for w in path.read_text(encoding="utf-8").split("\n") if w)
        except (OSError, UnicodeDecodeError) as err:
            raise KVBenchError(f"{path}: cannot be read as UTF-8 text ({err})") from err
        if not lists[name]:
            raise KVBenchError(f"{path}: holds no word (one word per line expected)")
    return lists, where


@cache
def english_words(data_dir: str | None) -> tuple[str, ...]:
    """RULER's ``english_words.json`` values (cwe's pool once it needs more than wonderwords' words).

    Raises
    ------
    KVBenchError
        If the file is absent, or is not a JSON object of strings.
    """
    path = _local(data_dir, ENGLISH_WORDS)
    if path is None:
        raise _missing(data_dir, ENGLISH_WORDS, "it has no hub equivalent (cwe at this length needs it)")
    words = check_row(_read_json(path), {}, str(path))
    check_value(list(words.values()), "texts", f"{path}: its values")
    return tuple(words.values())


def _hub(hub_id: str, config: str | None, split: str, data_dir: str | None, name: str):
    try:
        import datasets

        return datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # any hub/network failure means the same thing to the user
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise _missing(data_dir, name, f"hub dataset {hub_id} unavailable ({reason})") from err


def _checked(questions: list[dict], where: str) -> list[dict]:
    """``questions`` once each question's text and answers are text (``tasks.fields``)."""
    for n, question in enumerate(questions, start=1):
        check_value(question["query"], "text", f"{where}: question {n}")
        check_value(question["outputs"], "texts", f"{where}: the answers of question {n}")
    return questions


def _squad_hub(data_dir: str | None) -> list[list[tuple[str, list[dict]]]]:
    """SQuAD v2 validation from the hub, regrouped as the dev file's articles and paragraphs."""
    rows = _hub("rajpurkar/squad_v2", None, "validation", data_dir, SQUAD)
    articles, index = [], {}
    for row in rows:
        if row["title"] not in index:
            index[row["title"]] = len(articles)
            articles.append([])
        paragraphs = articles[index[row["title"]]]
        if not paragraphs or paragraphs[-1][0] != row["context"]:
            paragraphs.append((row["context"], []))
        texts = list(row["answers"]["text"])
        answers = [{"text": t} for t in texts]
        paragraphs[-1][1].append(
            {"question": row["question"], "answers": answers, "is_impossible": not texts}
        )
    return articles


@cache
def squad(data_dir: str | None) -> tuple[list[dict], tuple[str, ...], str]:
    """SQuAD v2 dev as RULER's ``read_squad``: answerable questions in file order, each with its
    gold paragraph and the other paragraphs of its article; documents = sorted unique paragraphs.

    Returns
    -------
    tuple
        ``(questions, documents, source)``; a question is ``{query, outputs, gold, more}`` with
        document indices in ``gold`` and ``more``.

    Raises
    ------
    KVBenchError
        If neither the file nor the hub dataset can be read, or the file is not laid out as SQuAD's
        dev file (a paragraph, question or answer that is not text included).
    """
    path = _local(data_dir, SQUAD)
    where = str(path.resolve()) if path is not None else "hf://rajpurkar/squad_v2/validation"
    with _layout(where, "SQuAD v2 JSON"):
        if path is not None:
            articles = [[(p["context"], p["qas"]) for p in a["paragraphs"]] for a in _read_json(path)["data"]]
        else:
            articles = _squad_hub(data_dir)
        contexts = [context for paragraphs in articles for context, _ in paragraphs]
        for n, context in enumerate(contexts, start=1):
            check_value(context, "text", f"{where}: paragraph {n}")
        docs = tuple(sorted(set(contexts)))
        position = {d: i for i, d in enumerate(docs)}
        questions = []
        for paragraphs in articles:
            article = [position[c] for c, _ in paragraphs]
            for context, qas in paragraphs:
                gold = position[context]
                for qa in qas:
                    if not qa["is_impossible"]:
                        questions.append(
                            {
                                "query": qa["question"],
                                "outputs": [a["text"] for a in qa["answers"]],
                                "gold": [gold],
                                "more": [i for i in article if i != gold],
                            }
                        )
        return _checked(questions, where), docs, where


@cache
def hotpotqa(data_dir: str | None, name: str = HOTPOTQA) -> tuple[list[dict], tuple[str, ...], str]:
    """HotpotQA dev (distractor) as RULER's ``read_hotpotqa``: each question's ten context entries
    as gold documents ``"title\\n" + "".join(sentences)``; documents = sorted unique entries.

    ``name`` is a file in ``<data_dir>/ruler/`` or an absolute path (the full official file gives
    RULER's distractor pool); the hub fallback is ``hotpotqa/hotpot_qa`` (distractor, validation).

    Raises
    ------
    KVBenchError
        If neither the file nor the hub dataset can be read, or the file is not laid out as
        HotpotQA's (a question, answer or context sentence that is not text included).
    """
    path = _local(data_dir, name)
    if path is not None:
        where = str(path.resolve())
        with _layout(where, "a HotpotQA JSON list"):
            records = [
                (r["question"], r["answer"], [(t, s) for t, s in r["context"]]) for r in _read_json(path)
            ]
    else:
        rows = _hub("hotpotqa/hotpot_qa", "distractor", "validation", data_dir, name)
        pairs = (zip(r["context"]["title"], r["context"]["sentences"], strict=True) for r in rows)
        records = [(r["question"], r["answer"], list(p)) for r, p in zip(rows, pairs, strict=True)]
        where = "hf://hotpotqa/hotpot_qa/distractor/validation"
    with _layout(where, "a HotpotQA JSON list"):
        for n, (_, _, context) in enumerate(records, start=1):
            for title, sentences in context:
                check_value(sentences, "texts", f"{where}: question {n}, context {title!r}")
        render = [[f"{t}\n{''.join(s)}" for t, s in ctx] for _, _, ctx in records]
    docs = tuple(sorted({d for entries in render for d in entries}))
    position = {d: i for i, d in enumerate(docs)}
    questions = [
        {"query": q, "outputs": [a], "gold": [position[d] for d in entries], "more": []}
        for (q, a, _), entries in zip(records, render, strict=True)
    ]
    return _checked(questions, where), docs, where
