"""Shared fixtures: a tiny random GQA Llama, the embedded model, the data directory, ``run.py`` in
this process."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # Triton kernels run on the CPU interpreter (set before triton.jit)
    os.environ.setdefault("TRITON_INTERPRET", "1")

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # pytest -n N: the cores shared among the workers
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_threads)
    # and among the run.py processes the tests start: more threads than cores make OpenMP's
    # barriers spin-wait on a thread that is not scheduled (a run 10-50x slower)
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))

import pytest
from omegaconf import OmegaConf
from transformers import LlamaForCausalLM

import methods  # noqa: F401  (registers the "kvbench" attention implementation)
from tests.architectures import tiny_config

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("KVBENCH_DATA_DIR") or REPO.parent / "shared" / "data")


def tiny_llama(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    """Random Llama with GQA (6 query heads on 2 KV heads, head_dim 16), fp32, 'kvbench' attention: the
    llama family's tiny config (``tests.architectures``) resized."""
    torch.manual_seed(seed)
    sizes = dict(hidden_size=96, intermediate_size=192, num_hidden_layers=layers, num_attention_heads=6)
    config = tiny_config("llama", **sizes, max_position_embeddings=1024, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    # Larger weights give peaked, input-dependent logits (random init is nearly uniform).
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model


@pytest.fixture(scope="session")
def tiny_model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="session")
def embedded():
    """``(model, tokenizer)`` of the embedded SmolLM2-135M-Instruct."""
    from runners.models.loading import load_model, load_tokenizer

    cfg = OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml")
    return load_model(cfg), load_tokenizer(cfg)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA_DIR / "xsum" / "test.jsonl").is_file():
        pytest.skip(f"no evaluation data under {DATA_DIR} (set KVBENCH_DATA_DIR)")
    return DATA_DIR


@pytest.fixture(scope="session")
def ruler_dir() -> str:
    """The data directory holding ``ruler/`` (RULER's input files)."""
    if not (DATA_DIR / "ruler" / "PaulGrahamEssays.json").is_file():
        pytest.skip(f"no RULER inputs under {DATA_DIR / 'ruler'} (set KVBENCH_DATA_DIR)")
    return str(DATA_DIR)


def set_attn(model, name: str) -> None:
    """Switch a loaded model's attention implementation (e.g. to 'sdpa' for model.generate)."""
    model.set_attn_implementation(name)


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded model's tokenizer (no weights loaded)."""
    from runners.models.loading import load_tokenizer

    return load_tokenizer(OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml"))


@pytest.fixture
def run_py(tmp_path, monkeypatch, capsys):
    """``python run.py logger=table runner.progress=false <overrides>`` run in this process: ``run.py``
    executed as ``__main__`` (the same composition, validation, error lines and exit codes) without
    a fresh interpreter's ~5 s of imports (Hydra's logging set-up is skipped). Results and logs go
    under ``tmp_path``; the environment, ``sys.argv`` and the working directory are restored
    afterwards. The subprocess path itself is tested in tests/test_cli.py (``run_cli``).

    Returns a function ``(*overrides, data_dir=None) -> subprocess.CompletedProcess`` (returncode,
    stdout and stderr as the command line would give them)."""

    def call(*overrides: str, data_dir: str | None = None) -> subprocess.CompletedProcess:
        env = {
            "KVBENCH_RESULTS_DIR": str(tmp_path / "results"),
            "KVBENCH_LOG_DIR": str(tmp_path / "logs"),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # run.py sets both: restored afterwards
            "HYDRA_FULL_ERROR": os.environ.get("HYDRA_FULL_ERROR", "1"),
        }
        if data_dir is not None:
            env["KVBENCH_DATA_DIR"] = data_dir
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        argv = ["run.py", "logger=table", "runner.progress=false", *overrides]
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.chdir(REPO)
        # Hydra's logging set-up would close pytest's own log handlers: skipped in-process.
        for module in ("hydra.core.utils", "hydra._internal.hydra"):
            monkeypatch.setattr(f"{module}.configure_log", lambda *args, **kwargs: None)
        capsys.readouterr()
        try:
            runpy.run_path(str(REPO / "run.py"), run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    return call
