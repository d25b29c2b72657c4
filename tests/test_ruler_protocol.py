"""RULER under kvpress's leaderboard protocol: RULER's fixed document order in qa, kvpress's split of
a prompt into context, question and answer prefix, its two-piece tokenization, and what a query-aware
run compresses (embedded tokenizer, no model)."""

from __future__ import annotations

import random

import pytest

from runners.quality import question_starts
from tasks.generators import ruler_qa
from tasks.ruler import Ruler, split
from tests.conftest import DATA_DIR

QA = {"query": "Where?", "outputs": ["here"], "gold": [0], "more": []}
DOCS = tuple(f"document {i}" for i in range(40))


def rulers_gold_places(units: int, gold: int, seed: int = 42) -> list[int]:
    """Where RULER's ``random.Random(seed).shuffle(all_docs)`` puts the first ``gold`` of ``units``
    documents (1-based), the gold ones first before the shuffle."""
    order = list(range(units))
    random.Random(seed).shuffle(order)
    return sorted(order.index(k) + 1 for k in range(gold))


@pytest.mark.parametrize(("units", "place"), [(10, 9), (20, 19), (30, 28)])
def test_qa_gold_document_where_ruler_puts_it(units, place):
    """One permutation per document count: qa_1's gold document 9th of 10, 19th of 20, 28th of 30,
    whatever the sample's own seed."""
    for seed in ("42-qa_1-4096-0", "42-qa_1-4096-7", "other"):
        assert ruler_qa.build(units, seed, QA, DOCS, 42).meta["gold_documents"] == [place]
    assert (
        rulers_gold_places(units, 1, seed=7) == ruler_qa.build(units, "x", QA, DOCS, 7).meta["gold_documents"]
    )


@pytest.fixture(scope="module")
def samples(tokenizer):
    """Both protocols of niah_single_1, vt and qa_1/qa_2 at 2048 tokens, 3 samples each."""
    if not (DATA_DIR / "ruler" / "squad_dev_v2.json").is_file():
        pytest.skip(f"no RULER inputs under {DATA_DIR / 'ruler'} (set KVBENCH_DATA_DIR)")
    ruler_dir = str(DATA_DIR)
    kwargs = {"data_dir": ruler_dir, "tasks": ["niah_single_1", "vt", "qa_1", "qa_2"], "lengths": [2048]}
    agnostic, aware = Ruler(limit=3, **kwargs), Ruler(limit=3, query_aware=True, **kwargs)
    return agnostic, agnostic.load(tokenizer), aware, aware.load(tokenizer)


def test_generated_qa_samples_follow_rulers_order(samples):
    _, generated, _, _ = samples
    for s in generated:
        if s.meta["task"] in ("qa_1", "qa_2"):
            gold = 1 if s.meta["task"] == "qa_1" else 10
            assert s.meta["gold_documents"] == rulers_gold_places(s.meta["units"], gold), s.id


def test_question_and_answer_prefix_split_as_kvpress(samples):
    """The question runs from the newline(s) before it to the blank before the answer prefix; the
    answer prefix starts at its first word (kvpress's ``simonjegou/ruler`` columns)."""
    _, generated, _, aware_samples = samples
    starts = {
        "niah_single_1": "\nWhat is",
        "vt": "\nQuestion: Find",
        "qa_1": "\n\nAnswer the",
        "qa_2": "\n\nAnswer",
    }
    prefixes = {
        "niah_single_1": "The special magic number for ",
        "vt": "Answer: According",
        "qa_1": "Answer:",
    }
    for s in generated:
        context, question, prefix = split(s)
        assert question.startswith(starts[s.meta["task"]])
        assert s.meta["task"] == "vt" or not context[-1].isspace()  # vt's last noise line ends in "\n"
        assert question.endswith(" ") and not question.endswith("  ") and not prefix[0].isspace()
        assert prefix.startswith(prefixes.get(s.meta["task"], "Answer:"))
    assert [s.prompt_text for s in generated] == [s.prompt_text for s in aware_samples]  # one sample


def test_context_and_question_tokenized_apart(samples, tokenizer):
    """kvpress's pipeline: the chat template up to the context's end, tokenized alone; then the
    question, the end of turn, the generation prompt and the answer prefix, tokenized together. The
    compression stops at the question's first newline."""
    task, generated, _, _ = samples
    prompts = [task.encode(tokenizer, s) for s in generated]
    for s, ids, start in zip(
        generated, prompts, question_starts(tokenizer, task, generated, prompts), strict=True
    ):
        context, question, prefix = split(s)
        turn = tokenizer.apply_chat_template(
            [{"role": "user", "content": "#"}], add_generation_prompt=True, tokenize=False
        )
        head, tail = turn.split("#")
        first = tokenizer(head + context, add_special_tokens=False)["input_ids"]
        rest = tokenizer(question + tail + prefix, add_special_tokens=False)["input_ids"]
        assert ids[0].tolist() == first + rest and start == len(first)
        assert tokenizer.decode(ids[0, start:]).startswith(question)
        assert tokenizer.decode(ids[0, :start]).endswith(context[-20:])


def test_query_aware_appends_the_end_of_turn_and_answer_prefix(samples, tokenizer):
    """``query_aware=true`` (kvpress's ``compress_questions``): context and question compressed; the
    end of turn, generation prompt and answer prefix appended uncompressed."""
    _, _, task, generated = samples
    prompts = [task.encode(tokenizer, s) for s in generated]
    starts = question_starts(tokenizer, task, generated, prompts)
    for s, ids, start in zip(generated, prompts, starts, strict=True):
        _, question, prefix = split(s)
        assert tokenizer.decode(ids[0, start:]) == "<|im_end|>\n<|im_start|>assistant\n" + prefix
        assert tokenizer.decode(ids[0, :start]).endswith(question)
        assert s.meta["prompt_tokens"] == ids.shape[1]
