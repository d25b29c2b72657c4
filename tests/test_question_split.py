"""The context/question split of LongBench and InfiniteBench (``task.query_aware=false``): which
text is the question, and where ``Task.question_start`` cuts the encoded prompt (embedded
tokenizer, real rows; no model)."""

from __future__ import annotations

import json

import pytest

from runners.quality import question_starts
from tasks.errors import KVBenchError
from tasks.gsm_infinite import GSMInfinite
from tasks.infinitebench import InfiniteBench
from tasks.longbench import SUBSETS, LongBench, question_of
from tasks.truncation import middle_truncate
from tasks.xsum import XSum


def pair(cls, **kwargs):
    """The task run query-aware and query-agnostic, otherwise alike."""
    return cls(**kwargs, query_aware=True), cls(**kwargs, query_aware=False)


def check_split(task, tokenizer, sample, before: str) -> int:
    """``question_start`` cuts the prompt where the question starts, its leading blanks included:
    ``decode(ids[start:])`` begins with the question (within its first token, which may straddle
    the start) and ``decode(ids[:start])`` ends with ``before`` (the context's end)."""
    ids = task.encode(tokenizer, sample)[0].tolist()
    start = task.question_start(tokenizer, sample, task.encode(tokenizer, sample))
    head, first, tail = (
        tokenizer.decode(part) for part in (ids[:start], ids[start : start + 1], ids[start:])
    )
    question = sample.question.rstrip()
    offset = tail.find(question)
    assert 0 <= offset < len(first), (sample.id, first, question[:40])
    assert (head + tail[:offset]).endswith(before), sample.id
    assert not tail[:offset] or tail[:offset] in before, sample.id  # a straddling token
    return start


@pytest.fixture(scope="module")
def longbench(data_dir):
    return pair(LongBench, data_dir=str(data_dir), subsets="local", limit=1)


def test_longbench_question_is_the_template_text_after_the_context(longbench, data_dir):
    table = json.loads((data_dir / "longbench" / "dataset2prompt.json").read_text())
    assert all(question_of(table[name], {"input": "Q?"}) for name in SUBSETS)  # all 21 have a split
    rows = {}
    for path in (data_dir / "longbench").glob("*.jsonl"):
        rows |= {r["_id"]: r for r in map(json.loads, path.read_text().splitlines())}
    for sample in longbench[1].load():
        row = rows[sample.id]
        context, question = sample.prompt_text.removesuffix(sample.question), sample.question
        assert context.endswith(row["context"]) and row["input"] in question and len(question) < 2000
    assert question_of("{input}\n\n{context}", {"input": "q"}) is None  # question before the context
    assert question_of("Read.\n\n{context}\n", {}) is None  # nothing after it
    assert question_of("{context}\n\nQ: {input}\nA:", {"input": "q"}) == "\n\nQ: q\nA:"


def test_longbench_question_start_on_real_prompts(longbench, tokenizer):
    aware, agnostic = longbench
    samples = agnostic.load()
    assert {s.meta["subset"] for s in samples} >= {"narrativeqa", "qasper", "samsum", "multi_news"}
    for sample, same in zip(samples, aware.load(), strict=True):
        ids = agnostic.encode(tokenizer, sample)
        assert ids.tolist() == aware.encode(tokenizer, same).tolist()  # the switch keeps the prompt
        start = check_split(
            agnostic, tokenizer, sample, sample.prompt_text.removesuffix(sample.question)[-40:]
        )
        assert 0 < start < ids.shape[1] - 3
    prompts = [agnostic.encode(tokenizer, s) for s in samples]
    assert question_starts(tokenizer, aware, samples, prompts) == [None] * len(samples)
    narrative = next(s for s in samples if s.meta["subset"] == "narrativeqa")
    raw = tokenizer(narrative.prompt_text)["input_ids"]
    assert len(raw) > agnostic.max_input_tokens  # middle-truncated, its question kept whole


def test_a_question_cut_by_truncation_starts_at_the_seam(data_dir, tokenizer):
    """A question longer than the kept tail: what survives of it is appended, the head compressed."""
    task = LongBench(
        data_dir=str(data_dir), subsets=["qasper"], limit=1, max_input_tokens=48, query_aware=False
    )
    (sample,) = task.load()
    truncated = middle_truncate(tokenizer, sample.prompt_text, 48)
    assert sample.question.strip() not in truncated
    ids = task.encode(tokenizer, sample)[0].tolist()
    start = task.question_start(tokenizer, sample, task.encode(tokenizer, sample))
    head = tokenizer.decode(tokenizer(truncated)["input_ids"][:24], skip_special_tokens=True)
    assert sample.prompt_text.startswith(head) and head in tokenizer.decode(ids[:start])
    kept = tokenizer.decode(ids[start:]).split("<|im_end|>")[0]
    assert len(kept) > 20 and sample.question.endswith(kept.lstrip()) and kept.lstrip() in truncated


def test_longbench_subset_without_split_is_refused(tmp_path, tokenizer):
    folder = tmp_path / "longbench"
    folder.mkdir()
    prompts = {"qasper": "{input}\n\n{context}", "narrativeqa": "Story: {context}"}
    (folder / "dataset2prompt.json").write_text(json.dumps(prompts))
    (folder / "dataset2maxlen.json").write_text(json.dumps({"qasper": 8, "narrativeqa": 8}))
    row = {"context": "text " * 20, "input": "why?", "answers": ["x"], "length": 20}
    lines = [json.dumps(row | {"_id": name, "dataset": name}) for name in prompts]
    (folder / "rows.jsonl").write_text("\n".join(lines))
    for aware in (True, False):
        task = LongBench(data_dir=str(tmp_path), subsets="local", query_aware=aware)
        samples = task.load()
        prompts_ids = [task.encode(tokenizer, s) for s in samples]
        assert [s.question for s in samples] == [None, None]
        if aware:
            assert question_starts(tokenizer, task, samples, prompts_ids) == [None, None]
        else:
            with pytest.raises(KVBenchError, match="task longbench has no context/question split"):
                question_starts(tokenizer, task, samples, prompts_ids)


@pytest.mark.parametrize("name", ["passkey", "number_string", "kv_retrieval"])
def test_infinitebench_question_start_on_generated_prompts(tokenizer, name):
    aware, agnostic = pair(InfiniteBench, tasks=[name], generate=True, lengths=[600], depths=[0.5])
    (sample,) = agnostic.load(tokenizer)
    (same,) = aware.load(tokenizer)
    assert sample.prompt_text.endswith(sample.question) and sample.question.startswith("\n\nQuestion: ")
    ids = agnostic.encode(tokenizer, sample)
    assert ids.tolist() == aware.encode(tokenizer, same).tolist()
    context = sample.prompt_text.removesuffix(sample.question)
    start = check_split(agnostic, tokenizer, sample, context[-40:])
    chunk = tokenizer.decode(ids[0, start:].tolist())
    assert chunk.endswith(sample.question)  # its blank lines appended with it (and a straddling token)


def test_tasks_without_a_split_refuse_query_agnostic():
    with pytest.raises(ValueError, match="xsum has no context/question split"):
        XSum(query_aware=False)
    with pytest.raises(ValueError, match="gsm_infinite marks no context/question split"):
        GSMInfinite(query_aware=False)
    with pytest.raises(ValueError, match="must be true or false"):
        LongBench(subsets=["qasper"], query_aware="no")
    assert XSum().query_aware and GSMInfinite().query_aware
