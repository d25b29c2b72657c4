"""The OOM-threshold search (``runner=oom``): bisection over a known limit, probes in capped child
processes (an allocation failure or a kill is oom, anything else an error), on the embedded model and
with the threshold's shape timed afterwards."""

from __future__ import annotations

import json
import math
import sys

import pytest

from runners.measure.oom import largest_fitting
from runners.measure.oom_probe import OOM_EXIT, Probe, run_capped
from tests.cli_runs import run_cli
from tests.conftest import REPO


class FakeAllocator:
    """Memory of a probe: ``per_unit`` bytes per batch row (or token) on top of a fixed base."""

    def __init__(self, limit: int, per_unit: int = 10, base: int = 25) -> None:
        self.limit, self.per_unit, self.base, self.tried = limit, per_unit, base, []

    def __call__(self, n: int) -> Probe:
        self.tried.append(n)
        fits = self.base + n * self.per_unit <= self.limit
        return Probe(n, "ok" if fits else "oom")


@pytest.mark.parametrize("limit", [25, 35, 60, 333, 655, 1000, 5000])
def test_bisection_returns_the_boundary_of_a_known_limit(limit):
    alloc = FakeAllocator(limit)
    threshold, probes = largest_fitting(alloc, 1, 64)
    expected = min(64, (limit - 25) // 10)
    assert threshold == (expected if expected >= 1 else None)
    assert [p.value for p in probes] == alloc.tried
    assert len(probes) <= math.ceil(math.log2(64)) + 2


def test_bisection_stops_on_a_non_oom_failure():
    with pytest.raises(RuntimeError, match="not an OOM"):
        largest_fitting(lambda n: Probe(n, "error", "boom"), 1, 8)


def test_capped_child_reports_oom_not_a_crash():
    """A child that fails to allocate under RLIMIT_AS exits OOM_EXIT (as a probe's child does); a
    child killed by a signal also counts as oom; an ordinary failure is an error."""
    alloc = (
        "import sys\ntry:\n    b = bytearray(8 * 2**30)\nexcept MemoryError as e:\n"
        f"    print('MemoryError', file=sys.stderr); sys.exit({OOM_EXIT})\n"
    )
    assert run_capped([sys.executable, "-c", alloc], 1 * 2**30, 60)[0] == "oom"
    assert run_capped([sys.executable, "-c", "bytearray(10**6)"], 1 * 2**30, 60) == ("ok", "")
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert run_capped([sys.executable, "-c", kill], 1 * 2**30, 60)[0] == "oom"
    assert run_capped([sys.executable, "-c", "raise SystemExit(1)"], 1 * 2**30, 60)[0] == "error"


@pytest.mark.integration
def test_cpu_oom_search_on_the_embedded_model(tmp_path):
    """Probes in capped child processes: a batch that cannot fit is recorded as oom and the
    bisection ends at a boundary (1 fits, 64 x 1024 tokens of FullKV cannot under 2.5 GiB)."""
    proc = run_cli(
        tmp_path, "runner=oom", "method=fullkv", "runner.prompt_len=1024", "runner.gen_len=2",
        "runner.low=1", "runner.high=64", "runner.memory_cap_gb=2.5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads(next((tmp_path / "results" / "runs").glob("*/record.json")).read_text())
    probes = record["efficiency"]["probes"]
    assert probes[0]["value"] == 64 and probes[0]["outcome"] == "oom"
    threshold = record["metrics"]["max_batch"]
    assert threshold is not None and 1 <= threshold < 64
    assert all(p["outcome"] == ("ok" if p["value"] <= threshold else "oom") for p in probes)
    assert (REPO / "runners" / "measure" / "oom.py").is_file()


@pytest.mark.integration
def test_oom_search_then_times_the_largest_batch_it_found(tmp_path):
    """``runner.measure_repeats``: after the search, the threshold's shape is timed as the
    efficiency runner times it (KeepKV Table 1 at the largest batch that fits)."""
    proc = run_cli(
        tmp_path, "runner=oom", "model=random", "model.shape=tiny", "method=h2o", "budget=0.25",
        "runner.prompt_len=64", "runner.gen_len=4", "runner.low=1", "runner.high=3",
        "runner.memory_cap_gb=6", "+runner.measure_repeats=2", "+runner.measure_warmup_steps=1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads(next((tmp_path / "results" / "runs").glob("*/record.json")).read_text())
    assert record["metrics"]["max_batch"] == 3  # the tiny model fits everything: high
    eff = record["efficiency"]
    assert eff["at_threshold_batch_size"] == 3 and eff["at_threshold_prompt_len"] == 64
    assert (
        len(eff["probes"]) == 1 and record["metrics"]["tokens_per_s"] == eff["at_threshold_tokens_per_s"] > 0
    )
    assert record["metrics"]["tokens_per_s"] == pytest.approx(3 * 4 / eff["at_threshold_latency_seconds"])
    assert "h2o: 3 x 64 + 4 ->" in proc.stdout
