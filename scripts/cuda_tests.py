"""Pytest plugin: run the selected tests with their models and prompts on CUDA.

    python -m pytest -p scripts.cuda_tests tests/test_kernels.py tests/test_compiled.py

The tests build their models (``tiny_model``, the embedded model) and prompts on the CPU. With this
plugin every model that enters ``runners.generation.model_run.ModelRun`` (every prefill and batch-1 step:
greedy generation, compiled steps, timing) is moved to the GPU first, and the token ids of its ``prefill``
and ``step`` with it; the compiled backend then captures CUDA graphs (``mode="reduce-overhead"``)
and ``kernels=auto`` takes the Triton decode kernel. Tests that build tensors on ``cuda`` themselves
(``tests/test_kernels.py``) need nothing from it.

Environment:

- ``KVBENCH_RANDOM_WEIGHTS=<config.json>``: ``runners.models.loading.load_model`` returns a randomly
  initialised model of this transformers config instead of reading weights (a GPU machine without
  the embedded model). Its weights are scaled by 4, as ``tests.conftest.tiny_llama`` does, so that
  greedy tokens are peaked and input-dependent rather than near-ties.
- ``KVBENCH_TEST_DEVICE`` (default ``cuda``): the device; ``cpu`` tries the plugin without a GPU.

Without a CUDA device the plugin refuses to run (``--collect-only`` still works).
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = torch.device(os.environ.get("KVBENCH_TEST_DEVICE", "cuda"))
RANDOM_WEIGHTS = os.environ.get("KVBENCH_RANDOM_WEIGHTS")


def _on_device(model: torch.nn.Module) -> None:
    """Move ``model`` (in place) to :data:`DEVICE` unless it is there already."""
    if next(model.parameters()).device != DEVICE:
        model.to(DEVICE)


def _patch_model_run() -> None:
    """``ModelRun`` moves its model before building the cache (the compiled step's mode and the
    cache's buffers follow the model's device) and the token ids of every call. Imported here, after
    the tests' conftest (which sets ``TRITON_INTERPRET`` on a machine without CUDA)."""
    from runners.generation.model_run import ModelRun

    init, prefill, step = ModelRun.__init__, ModelRun.prefill, ModelRun.step

    def moved_init(self, model, *args, **kwargs):
        _on_device(model)
        init(self, model, *args, **kwargs)

    ModelRun.__init__ = moved_init
    ModelRun.prefill = lambda self, input_ids: prefill(self, input_ids.to(DEVICE))
    ModelRun.step = lambda self, tokens: step(self, tokens.to(DEVICE))


def random_weights_model(cfg, device: str | None = "cpu") -> torch.nn.Module:
    """Stands in for ``runners.models.loading.load_model``: a random model of ``$KVBENCH_RANDOM_WEIGHTS``
    with the ``kvbench`` attention, in the dtype ``cfg.dtype`` names (float32 for ``auto``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(RANDOM_WEIGHTS)
    config._attn_implementation = "kvbench"
    dtype = cfg.get("dtype") or "auto"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32 if dtype == "auto" else getattr(torch, dtype)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model.to(DEVICE).eval()


def pytest_configure(config: pytest.Config) -> None:
    if DEVICE.type == "cuda" and not torch.cuda.is_available() and not config.option.collectonly:
        raise pytest.UsageError("scripts.cuda_tests: no CUDA device (torch.cuda.is_available() is False)")
    _patch_model_run()
    if RANDOM_WEIGHTS:
        import runners.models.loading

        runners.models.loading.load_model = random_weights_model


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Print a failure's traceback as soon as it is reported (also on the xdist controller), so that a
    step cut off by its time limit still shows why the tests that ran failed."""
    if report.failed:
        print(f"\n--- {report.nodeid} ({report.when}) failed:\n{report.longreprtext[-4000:]}", flush=True)
