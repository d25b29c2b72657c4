"""One probe of an OOM search (``runners.measure.oom``): a measurement shape run under a memory cap,
whose OOM is a recorded outcome. On CPU in a child process (``python -m runners.measure.oom_probe``)
whose address space is capped with ``RLIMIT_AS``; on CUDA in this process."""

from __future__ import annotations

import gc
import json
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf

from runners.output.record import failure, is_oom
from runners.setup.budget import resolve_budget
from runners.setup.build import build_method
from runners.setup.quant_kind import storage_of
from runners.setup.settings import RunSettings, read_settings
from tasks.errors import KVBenchError

OOM_EXIT = 3
#: the command line of a CPU probe's child process, its JSON payload appended
CHILD = (sys.executable, "-m", "runners.measure.oom_probe")


@dataclass
class Probe:
    """One tried value: ``outcome`` is ``ok``, ``oom`` or ``error`` (``detail`` says why)."""

    value: int
    outcome: str
    detail: str = ""
    seconds: float = 0.0


def run_probe(
    settings: RunSettings, batch: int, prompt_len: int, model: torch.nn.Module | None = None
) -> None:
    """One measurement shape (raises on OOM). Loads the model unless given."""
    from runners.measure.timing import synthetic_prompts, timed_generate
    from runners.models.loading import load_model

    method = build_method(settings)
    storage = storage_of(settings, method)
    model = model if model is not None else load_model(settings.model, "cpu")
    budget = resolve_budget(
        None if not method.traits.budget_applies else settings.budget,
        prompt_len,
        settings.model.max_context,
        settings.budget_unit,
    )
    r = settings.runner
    steps = r.probe_steps if r.probe_steps is not None else r.gen_len - 1
    ids = synthetic_prompts(model.config.vocab_size, batch, prompt_len, settings.seed).to(model.device)
    timed_generate(model, ids, method, budget, steps, storage=storage)


def run_capped(argv: list[str], cap_bytes: int, timeout: float) -> tuple[str, str]:
    """Run a child process under an address-space cap of ``cap_bytes``; ``(outcome, detail)``.

    Outcome ``ok`` (exit 0), ``oom`` (exit ``OOM_EXIT``, or killed by a signal: the OOM killer, an
    abort on ``bad_alloc``) or ``error`` (any other exit, or the timeout); detail is the last line
    the child wrote to stderr.
    """

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    try:
        proc = subprocess.run(argv, preexec_fn=limit, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "error", f"probe exceeded {timeout:.0f} s"
    tail = (proc.stderr.strip().splitlines() or [""])[-1][:300]
    if proc.returncode == 0:
        return "ok", ""
    if proc.returncode == OOM_EXIT or (proc.returncode == 1 and tail.startswith("MemoryError")):
        return "oom", tail  # the child's own verdict, or a MemoryError before it could give one
    if proc.returncode < 0:
        return "oom", f"killed by {signal.Signals(-proc.returncode).name}: {tail}"
    return "error", tail


def check_cap_leaves_room(settings: RunSettings, cap_bytes: int, timeout: float) -> None:
    """Start a capped child that only imports KVBench and loads the model: a cap below that is not
    an OOM threshold of the method but a cap too small to measure anything.

    Raises
    ------
    KVBenchError
        If the child fails under the cap (naming the cap and the child's last line).
    """
    payload = json.dumps({"cfg": OmegaConf.to_container(settings.config, resolve=True), "load_only": True})
    outcome, detail = run_capped(
        [sys.executable, "-m", "runners.measure.oom_probe", payload], cap_bytes, timeout
    )
    if outcome != "ok":
        raise KVBenchError(
            f"runner.memory_cap_gb={settings.runner.memory_cap_gb} leaves no room to start: importing "
            f"KVBench and loading {settings.model.name} under the cap failed "
            f"({outcome}: {detail or 'no message'}); raise the cap"
        )


def cpu_probe(settings: RunSettings, batch: int, prompt_len: int, cap_bytes: int, timeout: float) -> Probe:
    """Run one probe in a child process (``python -m runners.measure.oom_probe``, which reads the run's
    config at its own door) under ``cap_bytes``."""
    value = batch if settings.runner.search == "batch" else prompt_len
    payload = json.dumps(
        {"cfg": OmegaConf.to_container(settings.config, resolve=True), "batch": batch, "prompt": prompt_len}
    )
    start = time.perf_counter()
    outcome, detail = run_capped(
        [sys.executable, "-m", "runners.measure.oom_probe", payload], cap_bytes, timeout
    )
    return Probe(value, outcome, detail, time.perf_counter() - start)


def cuda_probe(settings: RunSettings, model: torch.nn.Module, batch: int, prompt_len: int) -> Probe:
    """Run one probe on the CUDA device of ``model`` in this process."""
    value = batch if settings.runner.search == "batch" else prompt_len
    start = time.perf_counter()
    try:
        run_probe(settings, batch, prompt_len, model)
        outcome, detail = "ok", ""
    except Exception as err:
        result = failure(err)
        if result["status"] != "oom":
            return Probe(value, "error", result["error"], time.perf_counter() - start)
        outcome, detail = "oom", result["error"][:300]
    gc.collect()
    torch.cuda.empty_cache()
    return Probe(value, outcome, detail, time.perf_counter() - start)


def _child(payload: str) -> int:
    """Child-process entry of a CPU probe (``python -m runners.measure.oom_probe``), the door of its
    run's config: exit 0 (fits), ``OOM_EXIT`` (allocation failed) or 1."""
    args = json.loads(payload)
    cfg = OmegaConf.create(args["cfg"])
    try:
        if args.get("load_only"):
            from runners.models.loading import load_model

            load_model(cfg.model, "cpu")
            return 0
        run_probe(read_settings(cfg), args["batch"], args["prompt"])
    except Exception as err:
        print(f"{type(err).__name__}: {err}".splitlines()[0], file=sys.stderr)
        return OOM_EXIT if is_oom(err) else 1
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
