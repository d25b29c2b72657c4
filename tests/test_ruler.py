"""RULER: generated samples against RULER's recipe (needles, templates, chains, word counts, gold
documents), sizing with the embedded model's tokenizer, and the chat-template and raw prompts (the rest:
tests/test_ruler_inputs.py)."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path

import pytest

from tasks.base import Sample
from tasks.generators.ruler_text import NOISE, split_sentences
from tasks.ruler import TASKS, TOKENS_TO_GENERATE, Ruler, split

LENGTH = 2048  # qa_2's ten gold HotpotQA documents need about 1.5K tokens
NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: (\S+)\.")


@pytest.fixture(scope="module")
def generated(tokenizer, ruler_dir):
    """``(task, samples)``: two samples of each of the 13 tasks at 2048 tokens."""
    task = Ruler(data_dir=ruler_dir, lengths=[LENGTH], limit=2, context_tokens=8192)
    samples = task.load(tokenizer)
    return task, {name: [s for s in samples if s.meta["task"] == name] for name in TASKS}


def haystack_lines(sample: Sample) -> list[str]:
    """The niah context after its instruction line."""
    return split(sample)[0].split("\n")[1:]


def test_sizes_fill_the_length(generated, tokenizer):
    """prompt + tokens to generate <= length, and one more haystack unit would overflow it."""
    task, by_task = generated
    for name, samples in by_task.items():
        budget = TOKENS_TO_GENERATE[TASKS[name][0]]
        for s in samples:
            assert s.max_new_tokens == budget
            tokens = task.encode(tokenizer, s).shape[1]
            assert tokens == s.meta["prompt_tokens"]
            assert tokens + budget <= LENGTH
            bigger = task.row(tokenizer, name, LENGTH, s.meta["index"], s.meta["units"] + 1)
            assert task._count(tokenizer, bigger) + budget > LENGTH
            if not name.startswith("qa") and name != "niah_multikey_3":  # units of 150-300 / 50 tokens
                assert tokens + budget > 0.97 * LENGTH, name


def test_niah_needles_and_queries(generated):
    """Needle counts, keys and values per task (synthetic.yaml), the needle template, and the
    answers' needles in the context."""
    _, by_task = generated
    expected = {  # task: (needles, distinct keys, answers)
        "niah_single_1": (1, 1, 1), "niah_single_2": (1, 1, 1), "niah_single_3": (1, 1, 1),
        "niah_multikey_1": (4, 4, 1), "niah_multikey_2": (1, 1, 1), "niah_multikey_3": (1, 1, 1),
        "niah_multivalue": (4, 1, 4), "niah_multiquery": (4, 4, 4),
    }  # fmt: skip
    for name, (needles, keys, answers) in expected.items():
        for s in by_task[name]:
            context, question, _ = split(s)
            found = [NEEDLE.fullmatch(n) for n in s.meta["needles"]]
            assert len(found) == needles and all(found), name
            assert len({m.group(2) for m in found}) == keys and len(s.references) == answers
            kind = "uuids" if name in ("niah_single_3", "niah_multikey_3") else "numbers"
            assert {m.group(1) for m in found} == {kind}
            queried = re.search(r"for (.+) mentioned", question).group(1).replace(", and ", ", ").split(", ")
            assert len(queried) == (4 if name == "niah_multiquery" else 1)
            pairs = {(m.group(2), m.group(3)) for m in found}
            assert {v for k, v in pairs if k in queried} == set(s.references)
            for needle in s.meta["needles"]:
                assert context.count(needle) == 1
            value = (
                r"\d{7}"
                if kind == "numbers"
                else r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
            )
            assert all(re.fullmatch(value, m.group(3)) for m in found)
            key = value if name == "niah_multikey_3" else r"[A-Za-z -]+-[A-Za-z -]+"  # adjective-noun
            assert all(re.fullmatch(key, m.group(2)) for m in found), name


def test_niah_positions(generated):
    """Noise / needle haystacks: needles on the recorded lines, every other line noise or a
    distractor needle; essay: needles after int(sentences x depth / 100) essay sentences."""
    _, by_task = generated
    for name in ("niah_single_1", "niah_multikey_2", "niah_multikey_3"):
        for s in by_task[name]:
            lines = haystack_lines(s)
            assert len(lines) == s.meta["units"] + len(s.meta["needles"])
            assert [lines[i] for i in s.meta["lines"]] == s.meta["needles"]
            others = [x for i, x in enumerate(lines) if i not in s.meta["lines"]]
            if name == "niah_single_1":
                assert set(others) == {NOISE}
            else:  # distractors: needles with other keys
                key = NEEDLE.fullmatch(s.meta["needles"][0]).group(2)
                assert all(NEEDLE.fullmatch(x) and NEEDLE.fullmatch(x).group(2) != key for x in others)
    for name in ("niah_single_2", "niah_multikey_1", "niah_multivalue", "niah_multiquery"):
        for s in by_task[name]:
            haystack = split(s)[0].split("\n", 1)[1]
            pieces = re.split("|".join(map(re.escape, s.meta["needles"])), haystack)
            before = 0
            for k, depth in enumerate(s.meta["depths"]):
                before += len(split_sentences(pieces[k].strip())) if pieces[k].strip() else 0
                assert before == int(s.meta["sentences"] * depth / 100), name
            assert all(d in range(0, 101) for d in s.meta["depths"])


def test_prompt_templates(generated):
    """RULER's task templates (constants.py), singular for one queried value."""
    _, by_task = generated
    s = by_task["niah_single_2"][0]
    key = re.search(r"for (\S+) mentioned", s.meta["question"]).group(1)
    assert split(s)[0].startswith(
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\n"
    )
    assert (
        s.meta["question"] == f"\nWhat is the special magic number for {key} mentioned in the provided text? "
    )
    assert s.meta["answer_prefix"] == f"The special magic number for {key} mentioned in the provided text is"
    s = by_task["niah_multivalue"][0]
    assert split(s)[0].startswith("Some special magic numbers are hidden")
    assert s.meta["answer_prefix"].endswith("mentioned in the provided text are")
    s = by_task["cwe"][0]
    assert s.meta["question"] == "\nQuestion: What are the 10 most common words in the above list? "
    assert s.meta["answer_prefix"] == "Answer: The top 10 words that appear most often in the list are:"
    s = by_task["fwe"][0]
    assert split(s)[0].startswith("Read the following coded text and track the frequency of each coded word.")
    assert (
        s.meta["answer_prefix"]
        == "Answer: According to the coded text above, the three most frequently appeared words are:"
    )
    s = by_task["qa_1"][0]
    assert split(s)[0].startswith("Answer the question based on the given documents. Only give me the answer")
    assert s.meta["question"].endswith(
        "\n\nQuestion: " + re.search(r"Question: (.*)$", s.meta["question"]).group(1)
    )
    assert s.meta["answer_prefix"] == "Answer:"
    for name, samples in by_task.items():
        for s in samples:
            assert s.prompt_text == "".join(split(s))
            assert len(split(s)[0]) > 4 * len(split(s)[1]), name  # the context dominates


def test_vt_chain(generated):
    """One chain of 4 hops: VAR X0 = value, VAR X1 = VAR X0, ...; the answer is its 5 variables in
    order, after a solved example with 3-letter variables."""
    _, by_task = generated
    for s in by_task["vt"]:
        context, question, prefix = split(s)
        value = re.search(r"the value (\d{5}) in the text above", question).group(1)
        assert prefix.endswith(f"5 variables are assgined the value {value}, they are: ")
        names = s.references
        assert len(names) == 5 and all(re.fullmatch("[A-Z]{5}", v) for v in names)
        example, sample = context.split(
            "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        )[-2:]
        assert re.search(r"VAR [A-Z]{3} = \d{5}", example)
        assert re.search(r"they are:  [A-Z]{3}( [A-Z]{3}){4}\n\n", example)
        positions = [sample.index(f"VAR {names[0]} = {value} ")]
        for prev, var in itertools.pairwise(names):
            assert sample.count(f"VAR {var} = ") == 1
            positions.append(sample.index(f"VAR {var} = VAR {prev} "))
        assert positions == sorted(positions)
        assert sample.count("VAR ") == 5 + 4  # 5 assignments, 4 of them naming a variable


def word_counts(sample: Sample, pattern: str) -> Counter:
    head = {
        "cwe": "Memorize the ones that appear most often.\n",
        "fwe": "Find the three most frequently appeared coded words. ",
    }
    body = split(sample)[0].split(head[sample.meta["task"]])[-1]
    return Counter(re.findall(pattern, body))


def test_cwe_answers_are_the_most_common(generated):
    _, by_task = generated
    for s in by_task["cwe"]:
        counts = word_counts(s, r"\d+\. (\S+)")
        common, uncommon = s.meta["repeats"]
        assert len(counts) == s.meta["units"] and len(s.references) == 10
        assert {counts[w] for w in s.references} == {common}
        assert {c for w, c in counts.items() if w not in s.references} == {uncommon} and uncommon < common
        assert re.search(r"are:1\. \S+ 2\. ", split(s)[0])  # the solved example's answer


def test_fwe_answers_are_the_top3_coded_words(generated):
    _, by_task = generated
    for s in by_task["fwe"]:
        counts = word_counts(s, r"\S+")
        assert counts.most_common(1)[0][0] == "..."
        ranked = [w for w, _ in counts.most_common() if w != "..."]
        assert ranked[:3] == s.references
        assert counts[s.references[2]] > counts[ranked[3]]
        assert all(re.fullmatch("[a-z]{6}", w) for w in counts if w != "...")


def test_qa_gold_documents(generated):
    """Sample i asks question i; its gold documents are in the context (each qa_2 question's ten
    HotpotQA paragraphs) and hold an answer."""
    task, by_task = generated
    import json

    hotpot = json.loads((Path(task.data_dir) / "ruler" / "hotpotqa_dev_first100.json").read_text())
    for name in ("qa_1", "qa_2"):
        for s in by_task[name]:
            context = split(s)[0]
            docs = re.split(
                r"\n\nDocument \d+:\n",
                "\n\n" + context.split("\n\nThe following are given documents.\n\n", 1)[1],
            )[1:]
            assert len(docs) == s.meta["units"]
            gold = [docs[n - 1] for n in s.meta["gold_documents"]]
            assert (
                any(a in d for a in s.references for d in gold)
                or s.references == ["yes"]
                or s.references == ["no"]
            )
            if name == "qa_2":
                record = hotpot[s.meta["index"]]
                assert s.meta["question"].endswith(record["question"] + " ") and s.references == [
                    record["answer"]
                ]
                assert {f"{t}\n{''.join(p)}" for t, p in record["context"]} <= set(docs)
    assert task.protocol()["qa_pools"]["qa_2"] | {"file": None} == {
        "questions": 100,
        "documents": 991,
        "file": None,
    }


def test_chat_template_and_raw_prompts(generated, tokenizer, ruler_dir):
    task, by_task = generated
    s = by_task["niah_single_1"][0]
    text = tokenizer.decode(task.encode(tokenizer, s)[0])
    assert text.endswith(s.meta["question"] + "<|im_end|>\n<|im_start|>assistant\n" + s.meta["answer_prefix"])
    raw = Ruler(data_dir=ruler_dir, tasks=["niah_single_1"], lengths=[1024], limit=1, chat_template="none")
    sample = raw.load(tokenizer)[0]
    context, question, prefix = split(sample)  # kvpress's two pieces, the first with BOS
    pieces = (
        tokenizer(context)["input_ids"] + tokenizer(question + prefix, add_special_tokens=False)["input_ids"]
    )
    assert raw.encode(tokenizer, sample)[0].tolist() == pieces
    protocol = task.protocol()
    assert (
        protocol["haystack"]["niah_single_2"] == "essay"
        and protocol["haystack"]["niah_multikey_2"] == "needle"
    )
    assert protocol["sentence_splitter"].startswith("kvbench") and protocol["seed"] == 42
    assert protocol["tokenizer"] == tokenizer.name_or_path and protocol["template"] == "base"
