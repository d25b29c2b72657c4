"""``decode_budget``, one switch for every method: the task protocol decides by default (RULER: the
kvpress leaderboard's rule, the context compressed once), an override picks the method's decode-time
rule, the record says which rule ran, and the reports label a run that decoded otherwise than its
protocol."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from reports.runs import decoding_tag, protocol_tag
from runners.results.store import run_config, run_id
from runners.setup.build import build_method
from runners.setup.decode_rule import decoding_protocol
from runners.setup.settings import read_settings
from tasks.errors import KVBenchError
from tests.conftest import REPO


def built(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    method = build_method(read_settings(cfg))
    return cfg, method


@pytest.mark.parametrize("name", ["tova", "h2o", "zsmerge", "keepkv", "streamingllm", "criticalkv_snapkv"])
def test_ruler_runs_every_method_prompt_only_unless_told(name):
    _, ruler = built(f"method={name}", "task=ruler")
    _, told = built(f"method={name}", "task=ruler", "decode_budget=true")
    _, xsum = built(f"method={name}", "task=xsum")
    assert ruler.traits.prompt_only and not told.traits.prompt_only
    paper = "prompt-only" if name == "criticalkv_snapkv" else "decode-time"  # SnapKV's paper: the prompt
    assert decoding_protocol(ruler) == {"decoding": "prompt-only", "paper_decoding": paper}
    assert decoding_protocol(xsum) == {"decoding": paper, "paper_decoding": paper}


def test_one_computation_one_run_id_however_it_was_asked_for():
    cfg_default, _ = built("method=tova", "task=ruler")
    cfg_explicit, _ = built("method=tova", "task=ruler", "decode_budget=false")
    cfg_decode, _ = built("method=tova", "task=ruler", "decode_budget=true")
    ids = [run_id(run_config(c), {}) for c in (cfg_default, cfg_explicit, cfg_decode)]
    assert ids[0] == ids[1] != ids[2]


def test_fullkv_and_prompt_only_methods_are_not_changed_by_the_rule():
    cfg, fullkv = built("method=fullkv", "task=ruler", "decode_budget=true")
    assert fullkv.decode_budget is None and "decode_budget" not in cfg.method
    assert decoding_protocol(fullkv) == {"decoding": None, "paper_decoding": None}
    with pytest.raises(KVBenchError, match="has no decode-time rule"):
        built("method=adakv_snapkv", "task=ruler", "decode_budget=true")


def test_a_bad_value_is_one_error_line():
    with pytest.raises(KVBenchError, match="decode_budget must be true, false or null, got 'maybe'"):
        built("method=tova", "decode_budget=maybe")


def record(task: dict, decoding: str, paper: str) -> dict:
    return {
        "method": "tova",
        "config": {"task": task},
        "protocol": {"decoding": decoding, "paper_decoding": paper},
    }


def test_reports_label_a_run_that_decoded_otherwise_than_its_protocol():
    ruler = {"query_aware": False, "decode_budget": False}
    assert decoding_tag(record(ruler, "prompt-only", "decode-time")) == ""
    assert decoding_tag(record(ruler, "decode-time", "decode-time")) == "decode-time"
    assert decoding_tag(record({}, "prompt-only", "decode-time")) == "prompt-only"
    assert decoding_tag(record({}, "decode-time", "decode-time")) == ""
    assert protocol_tag(record(ruler, "decode-time", "decode-time")) == "query_aware=false decode-time"


def test_every_method_without_a_decode_time_rule_refuses_decode_budget_true_and_the_docs_name_it():
    """A compressing method whose traits say it has no decode-time rule refuses ``decode_budget=true``
    before the model loads (``check_model``), and docs/methods.md lists it among those that do."""
    import dataclasses
    from types import SimpleNamespace

    from hydra.utils import instantiate

    from tests.faults import method_configs

    model = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=2)
    docs = (REPO / "docs" / "methods.md").read_text(encoding="utf-8")
    listed = " ".join(docs.split("`true` is refused by ")[1].split(")")[0].split())
    refusing = set()
    for config in method_configs():
        method = dataclasses.replace(instantiate(config), decode_budget=True)
        if method.traits.compresses and not method.traits.decode_rule:
            with pytest.raises(ValueError, match="has no decode-time rule"):
                method.check_model(model)
            refusing.add(type(method).__name__)
    assert refusing and not [name for name in sorted(refusing) if name not in listed]
