"""``model.chat_template_kwargs``: the variables every chat template is rendered with; thinking off by
default where the template reads ``enable_thinking`` (a Qwen3-style template on the embedded
tokenizer, no download), recorded in the run's protocol."""

from __future__ import annotations

import pytest

import runners.setup.build
from runners.models.loading import load_tokenizer
from runners.setup.build import load_prompts
from tasks.base import Sample, Task
from tasks.chat import template_kwargs
from tasks.errors import KVBenchError
from tasks.ruler import Ruler
from tests.chat_templates import QWEN3, SMOLLM2
from tests.conftest import DATA_DIR

NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3():
    """The embedded tokenizer carrying a Qwen3-style chat template."""
    tokenizer = load_tokenizer(SMOLLM2)
    tokenizer.chat_template = QWEN3
    return tokenizer


def ask(task: Task, tokenizer) -> str:
    return task.render(
        tokenizer, Sample(id="q", references=[], prompt_messages=[{"role": "user", "content": "Hi?"}])
    )[0]


def test_thinking_off_by_default_where_the_template_reads_it(qwen3, tokenizer):
    assert template_kwargs(qwen3, None) == {"enable_thinking": False}
    assert template_kwargs(tokenizer, None) == {}  # SmolLM2's template has no such variable
    assert template_kwargs(qwen3, {"enable_thinking": True}) == {"enable_thinking": True}
    assert ask(Task(), qwen3) == "<|im_start|>user\nHi?<|im_end|>\n" + NO_THINKING
    thinking = Task()
    thinking.chat_template_kwargs = {"enable_thinking": True}
    assert ask(thinking, qwen3) == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"


def test_the_runner_applies_and_records_the_models_kwargs(qwen3, monkeypatch):
    """``load_prompts`` renders every prompt with ``model.chat_template_kwargs`` (null: thinking off)
    and the task's protocol records what was used; RULER's answer prefix follows the empty
    thinking block."""
    if not (DATA_DIR / "ruler" / "PaulGrahamEssays.json").is_file():
        pytest.skip(f"no RULER inputs under {DATA_DIR / 'ruler'} (set KVBENCH_DATA_DIR)")
    monkeypatch.setattr(runners.setup.build, "load_tokenizer", lambda model: qwen3)
    for configured, think in ((None, False), ({"enable_thinking": True}, True)):
        model = SMOLLM2.copy()
        if configured is not None:
            model.chat_template_kwargs = configured
        task = Ruler(data_dir=str(DATA_DIR), tasks=["niah_single_1"], lengths=[1024], limit=1)
        _, (sample,), (ids,) = load_prompts(model, task)
        text = qwen3.decode(ids[0])
        tail = "<|im_end|>\n<|im_start|>assistant\n" + ("" if think else "<think>\n\n</think>\n\n")
        assert text.endswith("? " + tail + sample.meta["answer_prefix"])
        assert task.protocol()["chat_template_kwargs"] == {"enable_thinking": think}


def test_a_bad_value_is_one_error_line(run_py):
    with pytest.raises(KVBenchError, match="must be a dict of template variables or null"):
        template_kwargs(None, ["enable_thinking"])
    result = run_py("method=fullkv", "task=ruler", "+model.chat_template_kwargs=off")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "model.chat_template_kwargs must be a dict of template variables or null" in result.stderr
