"""OOM thresholds (``runner=oom``): the largest batch, or the longest prompt, of one method that
fits a memory cap, found by bisection. An OOM is a recorded outcome of a probe, never a crash.

- CPU: each probe runs in a child process (``python -m runners.measure.oom``) whose address space is
  capped with ``RLIMIT_AS`` (``runner.memory_cap_gb``); the child exits ``3`` on an allocation
  failure, and a child killed by a signal (the kernel OOM killer, an abort on ``bad_alloc``) also
  counts as ``oom``.
- CUDA: probes run in this process on the device, optionally capped with
  ``torch.cuda.set_per_process_memory_fraction(runner.cuda_memory_fraction)``; a
  ``torch.OutOfMemoryError`` is an ``oom``.

A probe is one full measurement shape: prefill and ``probe_steps`` decode steps
(``runners.measure.timing.timed_generate``), with the method's budget resolved for that prompt.

``runner.measure_repeats=N`` then times the threshold's shape as ``runner=efficiency`` does
(``runners.measure.efficiency.measure``: ``runner.measure_warmup_steps``, N repeats, medians): on
CUDA in this process under the same cap, on CPU in this process (the shape fitted under the cap in
the child). KeepKV Table 1's throughput at the largest batch a method fits.
"""

from __future__ import annotations

import gc
import json
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from omegaconf import OmegaConf

from runners.measure.efficiency import measure, start_synthetic_run
from runners.output.record import failure, is_oom, new_record, recording
from runners.setup.budget import resolve_budget
from runners.setup.build import build_method, run_budget
from runners.setup.options import EfficiencyOptions, OomOptions
from runners.setup.quant_kind import storage_of
from runners.setup.settings import RunSettings, check_device, read_settings
from tasks.errors import KVBenchError
from tasks.generators.fit import bisect_fitting

SEARCHES = ("batch", "context")
OOM_EXIT = 3


@dataclass
class Probe:
    """One tried value: ``outcome`` is ``ok``, ``oom`` or ``error`` (``detail`` says why)."""

    value: int
    outcome: str
    detail: str = ""
    seconds: float = 0.0


def largest_fitting(fits: Callable[[int], Probe], low: int, high: int) -> tuple[int | None, list[Probe]]:
    """Largest ``n`` in ``[low, high]`` whose probe is ``ok``, by bisection (memory is monotone in
    batch and length). ``high`` is tried first, then ``low``, then midpoints.

    Parameters
    ----------
    fits : callable
        ``fits(n) -> Probe``.
    low, high : int
        Search range (batch size or prompt tokens), ``1 <= low <= high``.

    Returns
    -------
    tuple[int | None, list[Probe]]
        The threshold (None if even ``low`` does not fit) and every probe in the order tried.

    Raises
    ------
    ValueError
        For an empty range.
    RuntimeError
        If a probe ends in ``error`` (not an OOM): the search cannot conclude.
    """
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= low <= high, got [{low}, {high}]")
    probes: list[Probe] = []

    def ok(n: int) -> bool:
        probe = fits(n)
        probes.append(probe)
        if probe.outcome == "error":
            raise RuntimeError(f"probe at {n} failed (not an OOM): {probe.detail}")
        return probe.outcome == "ok"

    if ok(high):
        return high, probes
    if low == high or not ok(low):
        return None, probes
    return bisect_fitting(ok, low, high), probes  # low fits, high does not


def probe_shape(r: OomOptions, search: str, value: int) -> tuple[int, int]:
    """``(batch, prompt_len)`` of a probe at ``value`` of the searched quantity (``r``: the runner's
    options)."""
    return (value, r.prompt_len) if search == "batch" else (r.batch_size, value)


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
    outcome, detail = run_capped([sys.executable, "-m", "runners.measure.oom", payload], cap_bytes, timeout)
    if outcome != "ok":
        raise KVBenchError(
            f"runner.memory_cap_gb={settings.runner.memory_cap_gb} leaves no room to start: importing "
            f"KVBench and loading {settings.model.name} under the cap failed "
            f"({outcome}: {detail or 'no message'}); raise the cap"
        )


def cpu_probe(settings: RunSettings, batch: int, prompt_len: int, cap_bytes: int, timeout: float) -> Probe:
    """Run one probe in a child process (``python -m runners.measure.oom``, which reads the run's
    config at its own door) under ``cap_bytes``."""
    value = batch if settings.runner.search == "batch" else prompt_len
    payload = json.dumps(
        {"cfg": OmegaConf.to_container(settings.config, resolve=True), "batch": batch, "prompt": prompt_len}
    )
    start = time.perf_counter()
    outcome, detail = run_capped([sys.executable, "-m", "runners.measure.oom", payload], cap_bytes, timeout)
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


def check_search(settings: RunSettings) -> None:
    """Validate the search before any work.

    Raises
    ------
    KVBenchError
        For an unknown search, an empty range, a too-long context (``model.max_context``, filled
        by ``runners.setup.build.build_method``), a device other than CPU or an available CUDA device,
        or a missing CPU cap.
    """
    r, model = settings.runner, settings.model
    if str(r.device).split(":")[0] not in ("cpu", "cuda"):
        raise KVBenchError(f"runner.device must be cpu or cuda[:N], got {r.device!r}")
    check_device(r.device, "runner.device")
    if r.search not in SEARCHES:
        raise KVBenchError(f"runner.search must be one of {SEARCHES}, got {r.search!r}")
    if not 1 <= r.low <= r.high:
        raise KVBenchError(f"need 1 <= runner.low <= runner.high, got [{r.low}, {r.high}]")
    longest = (r.high if r.search == "context" else r.prompt_len) + r.gen_len
    if longest > model.max_context:
        raise KVBenchError(
            f"a probe of {longest} tokens exceeds the context of {model.name} ({model.max_context})"
        )
    if r.device == "cpu" and not r.memory_cap_gb:
        raise KVBenchError("runner.memory_cap_gb is required on CPU (the child process' address-space cap)")


def measure_at(
    settings: RunSettings, method, storage, model: torch.nn.Module | None, batch: int, prompt_len: int
) -> dict:
    """The efficiency block (``runners.measure.efficiency.summarise``) of ``batch`` prompts of
    ``prompt_len`` tokens: ``runner.measure_warmup_steps``, ``runner.measure_repeats`` timed runs
    of ``runner.gen_len`` tokens. Loads the model on the CPU unless given (CUDA: the capped one)."""
    from runners.models.loading import load_model

    r = settings.runner
    model = model if model is not None else load_model(settings.model, "cpu")
    shape = EfficiencyOptions(
        name="efficiency",
        progress=r.progress,
        prompt_len=prompt_len,
        gen_len=r.gen_len,
        batch_size=batch,
        warmup_steps=r.measure_warmup_steps,
        repeats=r.measure_repeats,
    )
    budget = resolve_budget(
        run_budget(settings, method), prompt_len, settings.model.max_context, settings.budget_unit
    )
    timed, _ = measure(model, method, shape, settings.seed, budget, storage)
    print(f"{method.label}: {batch} x {prompt_len} + {r.gen_len} -> {timed['tokens_per_s']:.2f} tokens/s")
    return timed | {"batch_size": batch, "prompt_len": prompt_len}


def run_oom(settings: RunSettings) -> dict:
    """Find the OOM threshold of the method of ``settings`` and return its record (status ``ok`` even
    when nothing fits: the threshold is then None and every probe says ``oom``).

    Raises
    ------
    KVBenchError
        For bad input, before any probe.
    """
    method, storage, config, store, rid, done = start_synthetic_run(settings, check_search)
    if done is not None:
        return done
    r = settings.runner
    device = torch.device(r.device)
    model = None
    if device.type == "cuda":
        from runners.models.loading import load_model

        model = load_model(settings.model, r.device)
        if r.cuda_memory_fraction:
            torch.cuda.set_per_process_memory_fraction(float(r.cuda_memory_fraction), device)
    cap = int(r.memory_cap_gb * 2**30) if r.memory_cap_gb else None
    if model is None:
        check_cap_leaves_room(settings, cap, r.probe_timeout_s)

    def fits(n: int) -> Probe:
        batch, prompt = probe_shape(r, r.search, n)
        probe = (
            cpu_probe(settings, batch, prompt, cap, r.probe_timeout_s)
            if model is None
            else cuda_probe(settings, model, batch, prompt)
        )
        print(
            f"{method.label}: {r.search}={n} -> {probe.outcome} ({probe.seconds:.1f} s) {probe.detail}",
            flush=True,
        )
        return probe

    record = new_record(
        rid, config, method.label, "synthetic", device,
        shape={"prompt_len": r.prompt_len, "gen_len": r.gen_len, "batch_size": r.batch_size}, n_samples=0,
    )  # fmt: skip
    with recording(settings.config, store, record):  # an OOM inside a probe is an outcome, never raised here
        threshold, probes = largest_fitting(fits, r.low, r.high)
        key = "max_batch" if r.search == "batch" else "max_context"
        metrics = {key: threshold}
        if r.measure_repeats and threshold is not None:
            timed = measure_at(settings, method, storage, model, *probe_shape(r, r.search, threshold))
            metrics |= {k: timed[k] for k in ("tokens_per_s", "latency_seconds")}
            efficiency_at = {f"at_threshold_{k}": v for k, v in timed.items() if not isinstance(v, list)}
        else:
            efficiency_at = {}
        record.update(
            status="ok",
            metrics=metrics,
            efficiency={
                "search": r.search,
                "threshold": threshold,
                "memory_cap_bytes": cap,
                "cuda_memory_fraction": r.cuda_memory_fraction,
                "probes": [asdict(p) for p in probes],
                **efficiency_at,
            },
        )
    print(f"{method.label}: largest {r.search} that fits = {threshold}")
    return record


def _child(payload: str) -> int:
    """Child-process entry of a CPU probe, the door of its run's config: exit 0 (fits), ``OOM_EXIT``
    (allocation failed) or 1."""
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
