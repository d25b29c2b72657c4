"""The external files RULER's generators read, from ``<data_dir>/ruler/`` (docs/data.md), with the
hub (SQuAD v2, HotpotQA) or the ``wonderwords`` package as fall-backs.

Every loader returns the data and a description of where it came from (recorded in the result),
and raises :class:`tasks.errors.KVBenchError` with one line when neither source can be read.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from tasks.errors import KVBenchError

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


@cache
def essay_words(data_dir: str | None) -> tuple[tuple[str, ...], str]:
    """The essay haystack: the essays' text, whitespace collapsed, split on spaces (RULER niah.py).

    Raises
    ------
    KVBenchError
        If the file is absent (RULER builds it with a download script; no hub copy).
    """
    path = _local(data_dir, ESSAYS)
    if path is None:
        raise _missing(data_dir, ESSAYS, "it has no hub equivalent (set KVBENCH_DATA_DIR)")
    text = _read_json(path)["text"]
    return tuple(re.sub(r"\s+", " ", text).split(" ")), str(path.resolve())


@cache
def wonderwords(data_dir: str | None) -> tuple[dict[str, tuple[str, ...]], str]:
    """The noun, adjective and verb lists of wonderwords 2.2.0 (file order, duplicates kept).

    Falls back to an installed ``wonderwords`` package's assets (3.x drops 4 nouns).

    Raises
    ------
    KVBenchError
        If neither the directory nor the package is there.
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
    lists = {n: tuple(w for w in (folder / f"{n}list.txt").read_text().split("\n") if w) for n in names}
    return lists, where


@cache
def english_words(data_dir: str | None) -> tuple[str, ...]:
    """RULER's ``english_words.json`` values (cwe's pool once it needs more than wonderwords' words).

    Raises
    ------
    KVBenchError
        If the file is absent.
    """
    path = _local(data_dir, ENGLISH_WORDS)
    if path is None:
        raise _missing(data_dir, ENGLISH_WORDS, "it has no hub equivalent (cwe at this length needs it)")
    return tuple(_read_json(path).values())


def _hub(hub_id: str, config: str | None, split: str, data_dir: str | None, name: str):
    try:
        import datasets

        return datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # any hub/network failure means the same thing to the user
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise _missing(data_dir, name, f"hub dataset {hub_id} unavailable ({reason})") from err


@cache
def squad(data_dir: str | None) -> tuple[list[dict], tuple[str, ...], str]:
    """SQuAD v2 dev as RULER's ``read_squad``: answerable questions in file order, each with its
    gold paragraph and the other paragraphs of its article; documents = sorted unique paragraphs.

    Returns
    -------
    tuple
        ``(questions, documents, source)``; a question is ``{query, outputs, gold, more}`` with
        document indices in ``gold`` and ``more``.
    """
    path = _local(data_dir, SQUAD)
    if path is not None:
        articles = [[(p["context"], p["qas"]) for p in a["paragraphs"]] for a in _read_json(path)["data"]]
        where = str(path.resolve())
    else:
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
            qa = {"question": row["question"], "answers": answers, "is_impossible": not texts}
            paragraphs[-1][1].append(qa)
        where = "hf://rajpurkar/squad_v2/validation"
    docs = tuple(sorted({c for paragraphs in articles for c, _ in paragraphs}))
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
    return questions, docs, where


@cache
def hotpotqa(data_dir: str | None, name: str = HOTPOTQA) -> tuple[list[dict], tuple[str, ...], str]:
    """HotpotQA dev (distractor) as RULER's ``read_hotpotqa``: each question's ten context entries
    as gold documents ``"title\\n" + "".join(sentences)``; documents = sorted unique entries.

    ``name`` is a file in ``<data_dir>/ruler/`` or an absolute path (the full official file gives
    RULER's distractor pool); the hub fallback is ``hotpotqa/hotpot_qa`` (distractor, validation).
    """
    path = _local(data_dir, name)
    if path is not None:
        records = [(r["question"], r["answer"], [(t, s) for t, s in r["context"]]) for r in _read_json(path)]
        where = str(path.resolve())
    else:
        rows = _hub("hotpotqa/hotpot_qa", "distractor", "validation", data_dir, name)
        pairs = (zip(r["context"]["title"], r["context"]["sentences"], strict=True) for r in rows)
        records = [(r["question"], r["answer"], list(p)) for r, p in zip(rows, pairs, strict=True)]
        where = "hf://hotpotqa/hotpot_qa/distractor/validation"
    render = [[f"{t}\n{''.join(s)}" for t, s in ctx] for _, _, ctx in records]
    docs = tuple(sorted({d for entries in render for d in entries}))
    position = {d: i for i, d in enumerate(docs)}
    questions = [
        {"query": q, "outputs": [a], "gold": [position[d] for d in entries], "more": []}
        for (q, a, _), entries in zip(records, render, strict=True)
    ]
    return questions, docs, where
