"""RULER beyond the generated samples' recipe: RULER's scorers and the per-task average, the sentence
splitter, determinism and seeding, the inputs refused with one error, and the hub fallbacks of RULER's
qa pools."""

from __future__ import annotations

import pytest

from tasks.base import Sample
from tasks.errors import KVBenchError
from tasks.generators.ruler_text import split_sentences
from tasks.metrics.ruler_metrics import string_match_all, string_match_part
from tasks.ruler import Ruler


def test_scorers_match_ruler():
    assert string_match_all("The numbers are 123 and 456.", ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert string_match_all("  ABC-def \x07", ["abc-DEF"]) == 1.0
    assert string_match_all("12", ["123"]) == 0.0
    assert string_match_part("It was France.", ["Paris", "france"]) == 1.0
    assert string_match_part("Germany", ["Paris", "France"]) == 0.0
    # control characters become newlines before matching: "a\x01b" does not contain "a b"
    assert string_match_all("a\x01b", ["a b"]) == 0.0 and string_match_all("a\x01b", ["a\nb"]) == 1.0


def test_score_per_task_and_average():
    task = Ruler(tasks=["niah_multivalue", "qa_1"], limit=2)

    def sample(name: str, refs: list[str]) -> Sample:
        return Sample(id=name, references=refs, meta={"task": name, "length": 4096})

    samples = [sample("niah_multivalue", ["1", "2", "3", "4"]), sample("niah_multivalue", ["5"])]
    samples += [sample("qa_1", ["Paris", "France"]), sample("qa_1", ["Rome"])]
    metrics, per_sample = task.score(["1 and 3", "nothing", "france", "Milan"], samples)
    assert metrics["niah_multivalue"] == pytest.approx(25.0)  # (2/4 + 0) / 2
    assert metrics["qa_1"] == pytest.approx(50.0)  # any reference: (1 + 0) / 2
    assert metrics["avg"] == pytest.approx(37.5)  # mean of the task scores
    assert [p["score"] for p in per_sample] == [50.0, 0.0, 100.0, 0.0]


def test_sentence_splitter():
    text = 'Mr. Smith left at 5 p.m. on Friday. "Why?" she asked. Then J. R. came. It costs $5. 2010 was odd.'
    assert split_sentences(text) == [
        "Mr. Smith left at 5 p.m. on Friday.",
        '"Why?" she asked.',
        "Then J. R. came.",
        "It costs $5.",
        "2010 was odd.",
    ]
    assert " ".join(split_sentences(text)) == text


def test_deterministic_and_seeded(tokenizer, ruler_dir):
    kwargs = {"data_dir": ruler_dir, "tasks": ["niah_multikey_2", "vt", "qa_1"], "lengths": [1024]}
    first = Ruler(limit=2, **kwargs).load(tokenizer)
    assert first == Ruler(limit=2, **kwargs).load(tokenizer)
    one = Ruler(limit=1, **kwargs).load(tokenizer)
    assert one == [s for s in first if s.meta["index"] == 0]  # sample i does not depend on limit
    other = Ruler(limit=2, seed=7, **kwargs).load(tokenizer)
    assert all(a.prompt_text != b.prompt_text for a, b in zip(first, other, strict=True))


def test_bad_input_is_refused(tokenizer, ruler_dir):
    with pytest.raises(ValueError, match="unknown RULER task"):
        Ruler(tasks=["niah_single_9"])
    with pytest.raises(ValueError, match="exceed the model's context"):
        Ruler(lengths=[4096, 16384], context_tokens=8192)
    with pytest.raises(KVBenchError, match="qa_2 does not fit in 1024 tokens"):
        Ruler(data_dir=ruler_dir, tasks=["qa_2"], lengths=[1024], limit=1).load(tokenizer)
    with pytest.raises(KVBenchError, match="exceeds the 100 questions"):
        Ruler(data_dir=ruler_dir, tasks=["qa_2"], lengths=[2048], limit=101).load(tokenizer)
    with pytest.raises(KVBenchError, match=r"missing data: /nonexistent/ruler/\S+ not found"):
        Ruler(data_dir="/nonexistent", tasks=["niah_single_2"], lengths=[1024], limit=1).load(tokenizer)


def test_cli_refuses_a_length_beyond_the_context(run_py):
    result = run_py("method=fullkv", "task=ruler", "task.lengths=[9000]")
    assert result.returncode == 2
    assert (
        result.stderr.strip().count("\n") == 0
        and "task.lengths [9000] exceed the model's context" in result.stderr
    )
    assert "loading model" not in result.stdout


def test_hub_fallbacks_build_rulers_pools(monkeypatch, tmp_path):
    """Without the local files, SQuAD v2 and HotpotQA hub rows give the same pools as the files."""
    from tasks.generators import ruler_data

    hub_of_ruler_data = ruler_data._hub
    squad_rows = [
        {"title": "A", "context": "p1", "question": "q1", "answers": {"text": ["x", "y"]}},
        {"title": "A", "context": "p1", "question": "q2", "answers": {"text": []}},  # unanswerable
        {"title": "A", "context": "p2", "question": "q3", "answers": {"text": ["z"]}},
        {"title": "B", "context": "p0", "question": "q4", "answers": {"text": ["w"]}},
    ]
    hotpot_rows = [
        {
            "question": "h1",
            "answer": "yes",
            "context": {"title": ["T1", "T2"], "sentences": [["a ", "b"], ["c"]]},
        }
    ]
    hub = {"rajpurkar/squad_v2": squad_rows, "hotpotqa/hotpot_qa": hotpot_rows}
    monkeypatch.setattr(ruler_data, "_hub", lambda hub_id, *args: hub[hub_id])
    questions, docs, where = ruler_data.squad.__wrapped__(str(tmp_path))
    assert docs == ("p0", "p1", "p2") and where.startswith("hf://rajpurkar/squad_v2")
    assert [(q["query"], q["outputs"], q["gold"], q["more"]) for q in questions] == [
        ("q1", ["x", "y"], [1], [2]),
        ("q3", ["z"], [2], [1]),
        ("q4", ["w"], [0], []),
    ]
    questions, docs, _ = ruler_data.hotpotqa.__wrapped__(str(tmp_path))
    assert docs == ("T1\na b", "T2\nc") and questions == [
        {"query": "h1", "outputs": ["yes"], "gold": [0, 1], "more": []}
    ]

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the hub\nsecond line")

    monkeypatch.setattr(ruler_data, "_hub", hub_of_ruler_data)
    monkeypatch.setattr("datasets.load_dataset", offline)
    with pytest.raises(
        KVBenchError, match=r"squad_dev_v2.json not found and hub dataset .* unavailable"
    ) as err:
        ruler_data.squad.__wrapped__(str(tmp_path))
    assert "\n" not in str(err.value) and "Couldn't reach the hub" in str(err.value)
