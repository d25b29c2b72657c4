"""The jobs of a multirun in one process load a task once (``runners.setup.loaded``): a task in the same state
with the same tokenizer gets copies of the last samples and prompt ids and the attributes its load set,
so its record's protocol is the same; any other state (the tokenizer's name included) loads again."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import runners.setup.build
from runners.setup import loaded
from runners.setup.build import load_prompts
from tasks.ruler import Ruler
from tests.conftest import DATA_DIR, REPO


def test_same_task_loads_once_and_records_the_same_protocol(tokenizer, monkeypatch):
    if not (DATA_DIR / "ruler" / "PaulGrahamEssays.json").is_file():
        pytest.skip(f"no RULER inputs under {DATA_DIR / 'ruler'} (set KVBENCH_DATA_DIR)")
    monkeypatch.setattr(runners.setup.build, "load_tokenizer", lambda model: tokenizer)
    monkeypatch.setattr(loaded, "_LAST", [])
    calls = []
    original = Ruler.load
    monkeypatch.setattr(Ruler, "load", lambda self, tok: calls.append(self) or original(self, tok))
    model = OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml")

    def task(**kw) -> Ruler:
        fields = {"data_dir": str(DATA_DIR), "tasks": ["niah_single_1"], "lengths": [1024], "limit": 1}
        return Ruler(**fields | kw)

    first = task()
    _, samples, prompts = load_prompts(model, first)
    protocol = first.protocol()
    samples[0].meta["changed by a caller"] = True
    prompts[0][0, 0] = -1
    first.inputs.sources["changed later"] = "by the first task"
    again = task()
    _, samples2, prompts2 = load_prompts(model, again)
    assert len(calls) == 1  # not loaded again
    assert [s.prompt_text for s in samples2] == [s.prompt_text for s in samples]
    assert "changed by a caller" not in samples2[0].meta and int(prompts2[0][0, 0]) != -1  # copies
    assert torch.equal(prompts2[0][:, 1:], prompts[0][:, 1:])
    assert again.protocol() == protocol and again.source == first.source
    assert "changed later" not in again.inputs.sources  # the load's state, not the first task's today

    load_prompts(model, task(seed=43))  # another state
    assert len(calls) == 2
    template = tokenizer.chat_template
    try:
        tokenizer.chat_template = template + " "  # another tokenizer
        load_prompts(model, task(seed=43))
    finally:
        tokenizer.chat_template = template
    assert len(calls) == 3
    load_prompts(model, task(seed=43))
    name = tokenizer.name_or_path
    try:
        tokenizer.name_or_path = name + "-other"  # another model's tokenizer, the same rules
        load_prompts(model, task(seed=43))
    finally:
        tokenizer.name_or_path = name
    assert len(calls) == 5
