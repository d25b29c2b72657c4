"""Every option checked from one schema before anything loads (``runners.setup.schema``): the method's and the
task's dataclass, ``runners.setup.options`` for quant and runner. Each bad value is one ``error:`` line naming
the field, exit code 2, no model loaded and no record."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import runners.setup.build
from methods.checks import option
from runners.setup.build import load_prompts
from runners.setup.schema import check_config, check_node
from tasks.errors import KVBenchError
from tasks.xsum import XSum
from tests.chat_templates import SMOLLM2
from tests.conftest import REPO

#: (overrides, the error line) of inputs that crashed after "loading model" or ran a wrong value.
REFUSED = [
    (["quant=int8", "quant.group=0"], "quant.group must be a positive integer, got 0"),
    (["quant=int8", "quant.group=-64"], "quant.group must be a positive integer, got -64"),
    (["quant=int8", "quant.group=3"], "quant.group=3 does not divide the model's head_dim 64"),
    (["quant=int8", "quant.group=abc"], "quant.group must be a positive integer, got 'abc'"),
    (["quant=kivi2", "quant.residual=-32"], "quant.residual must be an integer >= 0, got -32"),
    (["quant=int4", "quant.bits=3"], "quant.bits must be one of [2, 4, 8], got 3"),
    (["quant=quanto_int4", "quant.group=128"], "quant.group=128 is wider than the model's head_dim 64"),
    (["quant=quanto_int4", "quant.bits=8"], "quanto's QuantizedCache takes (2, 4) bits, got 8"),
    (["method=dms", "method.threshold=abc"], "method.threshold must be a number, got 'abc'"),
    (["method=dms", "method.threshold=nan"], "method.threshold must be a number (finite), got nan"),
    (["method=dms", "method.threshold=inf"], "method.threshold must be a number (finite), got inf"),
    (["method=dms", "method.threshold=-1"], "threshold=-1 keeps every token"),
    (["method=dms", "method.scorer.window_size=x"], "method.scorer.window_size must be an integer, got 'x'"),
    (["method=leverage_score", "method.seed=abc"], "method.seed must be an integer or null, got 'abc'"),
    (
        ["method=leverage_score", "method.sketch_dimension=1.5"],
        "method.sketch_dimension must be a positive integer, got 1.5",
    ),
    (
        ["method=leverage_score", "method.sketch_dimension=100000"],
        "method.sketch_dimension must be an integer in [1, 64 (the model's head_dim)], got 100000",
    ),
    (["method=kvzip", "method.chunk_size=1.5"], "method.chunk_size must be a positive integer, got 1.5"),
    (
        ["method=chunkkv", "method.chunk_length=1.5"],
        "method.chunk_length must be a positive integer, got 1.5",
    ),
    (["method=kvzip", "method.layerwise=maybe"], "method.layerwise must be true or false, got 'maybe'"),
    (["method=kvzip_plus", "method.kvzip_plus_normalization=maybe"], "normalization must be true or false"),
    (["method=kvzip", "method.n_sink=100000"], "method.n_sink must be an integer in [1, 8192 (the model's"),
    (
        ["method=expected_attention", "method.recent=-1"],
        "method.recent must be an integer >= 0, got -1",
    ),
    (["method=cur", "method.num_sinks=100000"], "method.num_sinks must be an integer in [0, 8192 (the mod"),
    (
        ["method=simlayerkv", "method.n_recent=1e9"],
        "method.n_recent must be a positive integer, got 1000000000.0",
    ),
    (["method=snapkv", "+method.nosuch=1"], "method.nosuch is not an option of snapkv (its options:"),
    (["task.max_new_tokens=many"], "task.max_new_tokens must be a positive integer, got 'many'"),
    (
        ["runner=efficiency", "+runner.num_shards=2", "+runner.shard_index=0"],
        "runner.num_shards is not an option of runner=efficiency",
    ),
    (
        ["runner=error", "+runner.num_shards=2", "+runner.shard_index=0"],
        "runner.num_shards is not an option of runner=error",
    ),
    (["runner=efficiency", "runner.repeats=0"], "runner.repeats must be a positive integer, got 0"),
    (["runner=oom", "runner.progress=maybe"], "runner.progress must be true or false, got 'maybe'"),
    (["quant=int8", "runner.batch_size=2"], "with quant=int8 takes runner.batch_size=1 (got 2)"),
    (["+model.chat_template_kwargs={nosuch: 1}"], "model.chat_template_kwargs.nosuch: the tokenizer's chat"),
]


@pytest.mark.parametrize(("overrides", "message"), REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_a_bad_option_is_one_error_line_naming_it_before_loading(tmp_path, run_py, overrides, message):
    result = run_py("task.limit=1", *overrides)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert message in lines[0]
    assert "loading model" not in result.stdout
    assert not [p for p in (tmp_path / "results").rglob("*") if p.is_file()]


def test_every_preset_passes_its_schema():
    """No preset of a group is refused: the schema takes every value the configs ship."""
    root = REPO / "configs"
    with initialize_config_dir(str(root), version_base="1.3"):
        for group in ("method", "task", "runner", "quant"):
            for preset in sorted((root / group).glob("*.yaml")):
                check_config(compose("config", [f"{group}={preset.stem}"]))


@dataclass
class NewMethod:
    """A method written after the schema: its options are checked with no new code."""

    name = "new"
    window: int = option(8, low=1, high="max_context")
    ratio: float = option(0.5, low=0, high=1)
    flag: bool = False
    mode: Literal["a", "b"] = "a"
    note: str | None = None


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"window": "8"}, "method.window must be an integer in [1, 100 (the model's context)], got '8'"),
        ({"window": True}, "method.window must be an integer in [1, 100 (the model's context)], got True"),
        ({"window": 0}, "method.window must be an integer in [1, 100 (the model's context)], got 0"),
        ({"window": 101}, "method.window must be an integer in [1, 100 (the model's context)], got 101"),
        ({"ratio": 2.0}, "method.ratio must be a number in [0, 1], got 2.0"),
        ({"ratio": float("nan")}, "method.ratio must be a number in [0, 1] (finite), got nan"),
        ({"flag": "yes"}, "method.flag must be true or false, got 'yes'"),
        ({"flag": 1}, "method.flag must be true or false, got 1"),
        ({"mode": "c"}, "method.mode must be one of ['a', 'b'], got 'c'"),
        ({"note": 3}, "method.note must be a string or null, got 3"),
        ({"other": 3}, "method.other is not an option of new (its options: window, ratio, flag, mode, note)"),
    ],
)
def test_a_new_methods_options_are_checked_from_its_fields(node, message):
    with pytest.raises(KVBenchError) as err:
        check_node(OmegaConf.create(node), NewMethod, "method", {"max_context": 100})
    assert str(err.value) == message


def test_valid_options_pass_and_a_model_bound_waits_for_the_model():
    valid = {"window": 8, "ratio": 1, "flag": True, "mode": "b", "note": None}
    check_node(OmegaConf.create(valid), NewMethod, "method", {"max_context": 100})
    check_node(OmegaConf.create({"window": 10**6}), NewMethod, "method")  # no model facts yet


def test_chat_template_kwargs_with_no_chat_template_are_noted(tmp_path, monkeypatch, capsys):
    """``task.chat_template=none`` renders no template: the kwargs do not apply, and the run says so."""
    from tests.chat_templates import QWEN3

    tokenizer = runners.setup.build.load_tokenizer(SMOLLM2)
    tokenizer.chat_template = QWEN3
    monkeypatch.setattr(runners.setup.build, "load_tokenizer", lambda model: tokenizer)
    (tmp_path / "xsum").mkdir()
    row = {"document": "An article about rain.", "summary": "Rain.", "id": "1"}
    (tmp_path / "xsum" / "test.jsonl").write_text(json.dumps(row) + "\n")
    model = SMOLLM2.copy()
    model.chat_template_kwargs = {"enable_thinking": True}
    task = XSum(data_dir=str(tmp_path), limit=1, chat_template="none")
    load_prompts(model, task)
    assert "note: task.chat_template=none renders no chat template" in capsys.readouterr().out


def test_a_template_variable_the_template_never_reads_is_refused():
    """``model.chat_template_kwargs`` keys are the variables the template reads (``jinja2.meta``), not
    any text in it: ``role`` and ``message`` appear in Qwen3's template but are no variable of it."""
    from types import SimpleNamespace

    from tasks.chat import template_kwargs
    from tests.chat_templates import QWEN3

    tokenizer = SimpleNamespace(chat_template=QWEN3)
    assert template_kwargs(tokenizer, {"enable_thinking": True}) == {"enable_thinking": True}
    for key in ("role", "message", "thinking"):
        with pytest.raises(KVBenchError, match=f"chat_template_kwargs.{key}: the tokenizer.s chat template"):
            template_kwargs(tokenizer, {key: True})


def test_a_value_the_method_clamps_is_said_once():
    """SimLayerKV's recent window above the model's context covers every prompt: the run says so."""
    from runners.setup.schema import clamp_notes

    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("config", ["method=simlayerkv", "method.n_recent=100000"])
        default = compose("config", ["method=simlayerkv"])
    assert clamp_notes(cfg.method, {"max_context": 8192}) == [
        "method.n_recent=100000 is above the model's context (8192): the method clamps it to each "
        "prompt's length"
    ]
    assert clamp_notes(default.method, {"max_context": 8192}) == []
