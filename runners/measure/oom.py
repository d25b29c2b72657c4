"""OOM thresholds (``runner=oom``): the largest batch, or the longest prompt, of one method that
fits a memory cap, found by bisection. An OOM is a recorded outcome of a probe, never a crash.

- CPU: each probe runs in a child process (``runners.measure.oom_probe``) whose address space is
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

from collections.abc import Callable
from dataclasses import asdict

import torch

from runners.measure.efficiency import measure, start_synthetic_run
from runners.measure.oom_probe import Probe, check_cap_leaves_room, cpu_probe, cuda_probe
from runners.output.record import new_record, recording
from runners.setup.budget import resolve_budget
from runners.setup.build import run_budget
from runners.setup.options import EfficiencyOptions, OomOptions
from runners.setup.settings import RunSettings, check_device
from tasks.errors import KVBenchError
from tasks.generators.fit import bisect_fitting

SEARCHES = ("batch", "context")
OOM_EXIT = 3


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
