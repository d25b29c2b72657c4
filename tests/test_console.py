"""What a run prints besides its own lines: no deprecation warning from the model call (the cache is
passed under the name the installed transformers declares), and no INFO lines from libraries."""

from __future__ import annotations

import logging
import warnings

import torch

from methods import FullKV
from methods.seam.cache import CompressedCache
from runners.generation.model_run import cache_arguments, model_forward
from runners.registry import QUIET_LOGGERS, quiet_library_loggers


def test_a_model_call_raises_no_warning(tiny_model):
    cache = CompressedCache.for_model(tiny_model, FullKV(), None)
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # a FutureWarning (a deprecated argument) fails the test
        prefill = model_forward(tiny_model, ids[:, :8], torch.arange(8)[None], cache)
        step = model_forward(tiny_model, ids[:, 8:], torch.tensor([[8]]), cache)
    assert prefill.shape == step.shape == (1, 128) and cache.get_seq_length() == 9


def test_the_cache_goes_under_the_name_the_forward_declares(tiny_model):
    def older_forward(input_ids=None, past_key_values=None, **kwargs):  # transformers' earlier 5.x
        return input_ids

    compiled = torch.compile(tiny_model.forward)  # wraps the model's forward: the same name
    assert set(cache_arguments(older_forward, "c")) == {"past_key_values", "kvbench_cache"}
    assert set(cache_arguments(tiny_model, "c")) == set(cache_arguments(compiled, "c"))


def test_library_info_lines_are_not_shown(caplog):
    from rouge_score import rouge_scorer

    quiet_library_loggers()
    with caplog.at_level(logging.INFO):  # the root level Hydra's job logging sets
        rouge_scorer.RougeScorer(["rouge1"])  # absl: "Using default tokenizer."
        logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
        logging.getLogger("kernels.proof").warning("ours")
    assert [r.getMessage() for r in caplog.records] == ["ours"]
    assert all(logging.getLogger(name).getEffectiveLevel() == logging.WARNING for name in QUIET_LOGGERS)
