import pytest

from tasks.errors import KVBenchError
from tasks.xsum import XSum, rouge_f1


def test_rouge_against_hand_worked_example():
    means, per_sample = rouge_f1(["The cat sat."], ["the cat sat on the mat"])
    # unigrams: 3 of 3 predicted, 3 of 6 reference -> F1 = 2/3; bigrams 2/2, 2/5 -> 4/7
    assert means["rouge1"] == pytest.approx(100 * 2 / 3)
    assert means["rouge2"] == pytest.approx(100 * 4 / 7)
    assert means["rougeL"] == pytest.approx(100 * 2 / 3)
    assert rouge_f1(["running dogs"], ["the dog runs"])[0]["rouge1"] > 0  # stemming on
    assert len(per_sample) == 1


def test_local_rows_with_limit(data_dir):
    samples = XSum(data_dir=str(data_dir), limit=3).load()
    assert len(samples) == 3
    assert all(s.references[0] and "Summarize" in s.prompt_messages[0]["content"] for s in samples)


def test_missing_data_without_hub_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(KVBenchError, match="missing data") as err:
        XSum(data_dir=str(tmp_path), limit=2).load()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs", [{"limit": 0}, {"max_new_tokens": 0}])
def test_bad_task_settings_raise(kwargs):
    with pytest.raises(ValueError):
        XSum(**kwargs)
