"""InfiniteBench scorers against hand-worked examples; the offline generators' geometry."""

from __future__ import annotations

import json

import pytest
from rouge_score import rouge_scorer

from tasks.generators.infinitebench_synthetic import FILLER, generate
from tasks.infinitebench import InfiniteBench, label_of, max_new_tokens_for, render
from tasks.metrics import infinitebench_metrics as ib

#: (scorer, prediction, label, score) worked by hand.
HAND_WORKED = [
    ("passkey", "The pass key is 60494.", ["60494"], 1.0),
    ("passkey", "60 494", ["60494"], 0.0),  # first run of digits only
    ("kv_retrieval", 'The value is: "1b2c-3d4e".', ["1b2c-3d4e"], 1.0),
    ("kv_retrieval", "1b2c-3d4e-extra", ["1b2c-3d4e"], 0.0),
    ("math_find", "The answer is 3.5 or 4", ["3.5"], 1.0),
    ("math_find", "The answer is 3.5 or 4", ["4"], 0.0),  # first number decides
    ("math_find", "it is 12", ["12"], 1.0),
    ("math_calc", "1, 3, 6, 9", [1, 3, 6, 10], 0.75),
    ("math_calc", "2, 3", [1, 3], 0.0),  # stops at the first mistake
    ("code_run", "The output is `42`.", ["42"], 1.0),
    ("code_run", "42 is not it, 41", ["42"], 0.0),
    ("code_debug", "B. func_b", ["func_b", "B"], 1.0),
    ("code_debug", "The answer is: func_b", ["func_b", "B"], 1.0),
    ("code_debug", "I think C", ["func_b", "B"], 0.0),
    ("longdialogue_qa_eng", "It was John.", ["JOHN"], 1.0),
    ("longdialogue_qa_eng", "Johnny", ["JOHN"], 0.0),
    ("longbook_choice_eng", "B) the dog", ["the dog", "B"], 1.0),
    ("longbook_choice_eng", "The answer is C", ["the dog", "B"], 0.0),
    ("longbook_choice_eng", "The answer is B", ["the dog", "B"], 1.0),
    ("longbook_choice_eng", "maybe B then", ["the dog", "B"], 1.0),
    ("longbook_qa_chn", "北京天安门。", ["天安门"], pytest.approx(0.75)),  # chars: P 3/5, R 1
    ("qa_f1_max", "a cat", ["dog", "the cat"], 1.0),
]


@pytest.mark.parametrize(("scorer", "prediction", "label", "score"), HAND_WORKED)
def test_scorer_on_a_hand_worked_example(scorer, prediction, label, score):
    assert getattr(ib, scorer)(prediction, label) == score


def test_summary_scorer_is_rouge_lsum():
    want = rouge_scorer.RougeScorer(["rougeLsum"]).score("the cat sat", "the cat")["rougeLsum"].fmeasure
    assert ib.longbook_sum_eng("the cat", ["the cat sat"]) == pytest.approx(want) == pytest.approx(0.8)


def test_labels_and_answer_caps():
    row = {"answer": ["func_b"], "options": ["func_a", "func_b", "func_c", "func_d"]}
    assert label_of("code_debug", row) == ["func_b", "B"]
    assert label_of("passkey", {"answer": ["123"]}) == ["123"]
    assert max_new_tokens_for("passkey") == 4 and max_new_tokens_for("math_calc") == 1024
    assert max_new_tokens_for("kv_retrieval") == 29


def words(context: str, question: str) -> int:
    """A stand-in tokenizer: one token per whitespace-separated word of the rendered prompt."""
    return len(render(context, question).split())


@pytest.mark.parametrize("task", ["passkey", "number_string"])
@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_needle_once_at_depth_and_length(task, depth):
    row = generate(task, 3000, depth, seed=7, count_tokens=words)
    assert row.context.count(row.needle) == 1
    assert row.context.count(row.answer[0]) == 2  # the needle names the key twice, filler has no digits
    lines = row.context.split("\n")
    assert lines.index(row.needle.rstrip("\n")) == row.needle_index == round(depth * row.units)
    assert row.context.count(FILLER) == row.units
    assert abs(words(row.context, row.input) - 3000) <= 0.02 * 3000


def test_kv_retrieval_key_once_at_depth():
    row = generate("kv_retrieval", 2000, 0.5, seed=3, count_tokens=lambda c, q: len(render(c, q)) // 4)
    pairs = json.loads(row.context.removeprefix("JSON data:\n"))
    keys = list(pairs)
    assert keys.index(row.needle) == round(0.5 * (len(keys) - 1))
    assert row.context.count(row.needle) == 1 and pairs[row.needle] == row.answer[0]
    assert abs(len(render(row.context, row.input)) // 4 - 2000) <= 40


def test_generation_is_seeded():
    a = generate("passkey", 500, 0.5, seed=1, count_tokens=words)
    b = generate("passkey", 500, 0.5, seed=1, count_tokens=words)
    c = generate("passkey", 500, 0.5, seed=2, count_tokens=words)
    assert a.context == b.context and a.answer != c.answer


@pytest.mark.parametrize("tokens", [2000, 8000])
def test_grid_prompt_lengths_with_the_real_tokenizer(tokenizer, tokens):
    task = InfiniteBench(
        tasks=["passkey"], generate=True, lengths=[tokens], depths=[0.5], context_tokens=8192
    )
    (sample,) = task.load(tokenizer)
    n = task.encode(tokenizer, sample).shape[1]
    assert abs(n - tokens) <= 0.02 * tokens
    assert n + task.max_new(sample) <= 8192


def test_grid_metrics_per_cell(tokenizer):
    task = InfiniteBench(tasks=["passkey"], generate=True, lengths=[300], depths=[0.0, 1.0])
    samples = task.load(tokenizer)
    preds = [f"The pass key is {samples[0].references[0]}.", "I do not know"]
    metrics, _ = task.score(preds, samples)
    assert metrics["passkey/len300/depth0"] == 100.0 and metrics["passkey/len300/depth1"] == 0.0
    assert metrics["passkey"] == metrics["avg"] == 50.0


def test_bad_selection_is_rejected():
    with pytest.raises(ValueError, match="unknown InfiniteBench"):
        InfiniteBench(tasks=["nope"])
    with pytest.raises(ValueError, match="generate=true covers"):
        InfiniteBench(tasks=["code_run"], generate=True)
