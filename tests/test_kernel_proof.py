"""A Triton decode kernel runs only once proven (``kernels.proof``): a kernel that raises or returns
wrong numbers falls back to PyTorch with one warning under ``kernels=auto`` (the record says so) and
is one ``error:`` line under ``kernels=triton``; the real kernels pass their proof (CPU:
``TRITON_INTERPRET=1``, set in conftest)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from kernels import RAN, KernelProofError, decode_attention, proof, prove_all, set_backend
from kernels.decode_attention import decode_attention_torch
from kernels.ragged_decode import (
    packed_case,
    per_segment_attention,
    ragged_decode_attention,
    ragged_decode_attention_torch,
)
from runners.generation.greedy import ModelRun
from tests.conftest import tiny_llama

triton_decode = pytest.importorskip("kernels.triton_decode", reason="triton is not installed")
triton_ragged = pytest.importorskip("kernels.triton_ragged", reason="triton is not installed")
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def auto_takes_triton_here(monkeypatch):
    """``kernels=auto`` treats this CPU as it treats CUDA; no verdict from earlier tests; the
    backend and the ledger are restored afterwards."""
    monkeypatch.setattr(proof, "AUTO_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(proof, "VERDICTS", {})
    RAN.clear()
    yield
    set_backend("auto")
    RAN.clear()


def raises(*args, **kwargs):
    raise RuntimeError("PTX assembly aborted")


def uniform_off(query, keys, values, log_weight, scaling, return_logits=False, scores=None, decay=1.0):
    out, aux = decode_attention_torch(query, keys, values, log_weight, scaling, return_logits, scores, decay)
    return out * 1.01, aux


def ragged_off(query, keys, values, offsets, lengths, log_weight, scaling, return_probs):
    slot = torch.arange(keys.shape[0], device=keys.device)  # the packing's segment and valid slots again
    segment = torch.searchsorted(offsets, slot, right=True) - 1
    valid = slot - offsets[segment] < lengths[segment]
    args = (query, keys, values, offsets, lengths, segment, valid, log_weight, scaling)
    out, probs = ragged_decode_attention_torch(*args, return_probs=return_probs)
    return out, None if probs is None else probs + 0.01


def uniform_call():
    g = torch.Generator().manual_seed(1)
    query, (keys, values) = torch.randn(1, 6, 1, 16, generator=g), torch.randn(2, 1, 2, 20, 16, generator=g)
    return (query, keys, values, torch.zeros(1, 2, 20), 0.25), decode_attention, decode_attention_torch


def ragged_cpu_path(query, keys, values, offsets, lengths, segment, valid, log_weight, scaling):
    """What the dispatch falls back to on the CPU: the per-segment products."""
    return per_segment_attention(query, keys, values, offsets, lengths, log_weight, scaling, None, True)


def ragged_call():
    args = (*packed_case([5, 1, 9], 3, 16, 2, torch.Generator().manual_seed(1))[:7], None, 0.25)
    return args, ragged_decode_attention, ragged_cpu_path


CALLS = {"uniform": uniform_call, "ragged": ragged_call}
KERNELS = {
    "uniform": (triton_decode, "triton_decode_attention"),
    "ragged": (triton_ragged, "triton_ragged_decode_attention"),
}
WRONG = {"uniform": uniform_off, "ragged": ragged_off}


@pytest.mark.parametrize("fault", ["raises", "wrong numbers"])
@pytest.mark.parametrize("entry", ["uniform", "ragged"])
def test_auto_falls_back_to_pytorch_with_one_warning(entry, fault, monkeypatch, caplog):
    monkeypatch.setattr(*KERNELS[entry], raises if fault == "raises" else WRONG[entry])
    args, attend, reference = CALLS[entry]()
    with caplog.at_level(logging.WARNING):
        first, again = attend(*args), attend(*args)
    for got in (first, again):
        torch.testing.assert_close(got, reference(*args), rtol=0, atol=0)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"the Triton {entry} decode kernel (cpu, float32, head_dim 16, group 3" in warning.getMessage()
    assert ("PTX assembly aborted" if fault == "raises" else "differs from PyTorch") in warning.getMessage()
    assert RAN.summary(("uniform", "ragged")) == {"uniform": None, "ragged": None} | {entry: "torch"}


@pytest.mark.parametrize("entry", ["uniform", "ragged"])
def test_triton_asked_for_raises_instead(entry, monkeypatch, caplog):
    monkeypatch.setattr(*KERNELS[entry], raises)
    args, attend, _ = CALLS[entry]()
    set_backend("triton")
    message = f"^kernels=triton: the Triton {entry} decode kernel .* aborted"
    with pytest.raises(KernelProofError, match=message):
        attend(*args)
    assert not caplog.records


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_real_kernels_pass_their_proof(dtype):
    set_backend("triton")
    prove_all(CPU, dtype, 16, 3)
    assert len(proof.VERDICTS) == 10 and set(proof.VERDICTS.values()) == {None}
    set_backend("auto")
    for entry in ("uniform", "ragged"):
        args, attend, reference = CALLS[entry]()
        torch.testing.assert_close(attend(*args), reference(*args), rtol=1e-5, atol=1e-5)
    assert RAN.summary(("uniform", "ragged")) == {"uniform": "triton", "ragged": "triton"}


def test_a_compiled_step_is_proven_before_it_is_traced(monkeypatch, caplog):
    """A traced step cannot run a proof: building one proves every variant of both kernels."""
    import runners.generation.model_run
    from methods import FullKV

    monkeypatch.setattr(runners.generation.model_run, "compiled_forward", lambda model: model)
    monkeypatch.setattr(triton_decode, "triton_decode_attention", raises)
    with caplog.at_level(logging.WARNING):
        ModelRun(tiny_llama(), FullKV(), None, 8, backend="compiled")
    assert len(proof.VERDICTS) == 10 and len(caplog.records) == 6  # the 6 uniform variants failed
    assert {key[:5] for key in proof.VERDICTS} == {(kind, CPU, torch.float32, 16, 3) for kind in CALLS}


@pytest.fixture
def saved_llama(tmp_path):
    folder = tmp_path / "tiny-llama"
    tiny_llama().save_pretrained(folder)
    return folder


RUN = ("runner=efficiency", "budget=16", "runner.prompt_len=48", "runner.gen_len=4", "runner.repeats=1",
       "runner.warmup_steps=0")  # fmt: skip


@pytest.mark.parametrize(("method", "entry"), [("h2o", "uniform"), ("adakv_snapkv", "ragged")])
def test_the_record_says_which_kernel_ran(run_py, saved_llama, tmp_path, monkeypatch, caplog, method, entry):
    monkeypatch.setattr(*KERNELS[entry], raises)
    with caplog.at_level(logging.WARNING):
        proc = run_py("model=hf", f"model.id={saved_llama}", f"method={method}", *RUN)
    assert proc.returncode == 0, proc.stderr
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"the Triton {entry} decode kernel" in warnings[0], warnings
    record = json.loads(next((tmp_path / "results" / "runs").glob("*/record.json")).read_text())
    assert record["decode"] == {"uniform": None, "ragged": None, "backend": "eager"} | {entry: "torch"}


def test_kernels_triton_is_one_error_line_before_the_model_loads(run_py, saved_llama, monkeypatch):
    monkeypatch.setattr(triton_ragged, "triton_ragged_decode_attention", raises)
    proc = run_py("model=hf", f"model.id={saved_llama}", "method=h2o", "kernels=triton", *RUN)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: kernels=triton: the Triton ragged decode kernel (cpu, float32, ")
    assert "PTX assembly aborted" in lines[0] and "loading model" not in proc.stdout
