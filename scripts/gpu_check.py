"""One GPU acceptance command: the CUDA checks and the GPU benchmarks, ending with one summary table.

    bash scripts/gpu_check.sh                     # on a CUDA machine; about 10 minutes at most
    bash scripts/gpu_check.sh --out DIR --budget 540
    bash scripts/gpu_check.sh --dry-run           # any machine: list the steps, parse their command lines
    bash scripts/gpu_check.sh --steps compiled,bench_overhead --select random --methods streamingllm
                                                  # a short rerun of what failed

Steps (``scripts/gpu_steps.py``; each in its own process, its failure recorded in the table and the next
one run):

1. checks, run side by side (``scripts/cuda_tests.py`` puts the tests' models and prompts on CUDA):
   the Triton decode kernels against the PyTorch paths (``tests/test_kernels.py``, uniform heads;
   ``tests/test_ragged_kernel.py``, ragged heads), the slot bound
   at every step on CUDA (``tests/test_method_matrix.py``, budget and allocated-memory tests) and
   compiled steps with CUDA graphs giving eager's tokens (``tests/test_compiled.py``, on random
   weights of the embedded model's configuration: the weights are not on a GPU machine);
2. ``scripts/bench_cuda.py`` (Llama-2-7B shape, ``--cuda-layers`` of its layers): compiled FullKV vs
   transformers' static cache compiled, ZSMerge tokens/s vs FullKV, achieved bandwidth;
3. ``scripts/bench_ragged.py --device cuda`` (Llama-3-8B shape: 8 KV heads, group 4, head_dim 128,
   4096 slots per head, batch 8, bf16): decode attention over ragged heads vs uniform heads at equal
   total slots, the Triton kernels and the PyTorch paths;
4. ``scripts/bench_overhead.py --device cuda --backend compiled`` on random weights of SmolLM2-135M's
   configuration (``--overhead-layers`` layers): every method's decode step vs FullKV's.

Packages the GPU image lacks (omegaconf, hydra-core, antlr4, platformdirs) come as wheels in ``.whl/``
(``scripts/gpu_wheels.sh`` fills it where pip reaches PyPI) and are installed into a temporary
folder, never over torch. Writes ``summary.md`` (the table), ``summary.json``, ``steps.log`` (every
step's output) and the benchmarks' JSON into ``--out``. Exit status: 0 when every check and target
passes, 1 otherwise, 2 (one ``error:`` line) without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.gpu_steps import OVERHEAD_METHODS, PY, STEP_GROUPS, STEP_NAMES, Outcome, Row, Step, steps

REPO = Path(__file__).resolve().parent.parent

PROBE = """import json, platform
info = {"python": platform.python_version()}
for name in ("torch", "triton", "transformers", "omegaconf", "hydra", "platformdirs", "xdist"):
    try:
        info[name] = getattr(__import__(name), "__version__", "present")
    except ImportError:
        info[name] = None
    except Exception as err:
        info[name] = None
        info[name + " error"] = repr(err)
import torch
info["cuda"] = torch.cuda.is_available()
info["gpu"] = torch.cuda.get_device_name(0) if info["cuda"] else None
print(json.dumps(info))
"""


def start(argv: list[str], log: Path, env: dict) -> subprocess.Popen:
    """``argv`` in its own session (so that a time limit ends its children too), output to ``log``."""
    with log.open("w") as handle:
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )


def finish(proc: subprocess.Popen, deadline: float) -> int | None:
    """Wait until ``proc`` ends or ``deadline``; a process still running then is ended with its
    children (its own session) and None is returned."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=grace)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        return None


def run_group(
    group: list[Step], work: Path, env: dict, end: float, dry: bool, reserve: float = 0.0
) -> list[Outcome]:
    """Run ``group`` side by side, each within its ``max_seconds``, all leaving ``reserve`` seconds
    (the later chosen steps' needs) before ``end``."""
    now = time.monotonic()
    limit = min(min(s.max_seconds for s in group), end - now - reserve)
    if dry:
        limit = 300
    if limit < 20:
        return [Outcome(None, 0.0, work / f"{s.name}.log", "out of time") for s in group]
    procs = [(s, start(s.dry_run if dry else s.argv, work / f"{s.name}.log", env), now) for s in group]
    outcomes = []
    for step, proc, t0 in procs:
        code = finish(proc, t0 + limit)
        outcomes.append(Outcome(code, time.monotonic() - t0, work / f"{step.name}.log"))
    return outcomes


def dry_rows(step: Step, out: Outcome) -> list[Row]:
    text = out.log.read_text(errors="replace") if out.log.is_file() else ""
    tail = text.strip().splitlines()[-1] if text.strip() else ""
    return [
        Row(
            step.title,
            "dry-run" if out.returncode == 0 else "FAIL",
            tail[:90],
            "command line parses",
        )
    ]


def table(rows: list[Row]) -> str:
    lines = ["| check | result | time or number | target |", "|---|---|---|---|"]
    lines += [f"| {r.check} | {r.result} | {r.value} | {r.target} |" for r in rows]
    return "\n".join(lines)


def install_wheels(env: dict, work: Path) -> Row | None:
    """Install the wheels of ``.whl/`` into a temporary folder put first on ``PYTHONPATH``."""
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if not wheels:
        return None
    site = work / "site"
    cmd = [
        PY,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(site),
        *map(str, wheels),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    names = ", ".join(w.name.split("-")[0] + " " + w.name.split("-")[1] for w in wheels)
    if done.returncode != 0:
        return Row(
            "carried wheels (.whl/)", "FAIL", (done.stderr.strip().splitlines() or ["?"])[-1][:90], "-"
        )
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return Row("carried wheels (.whl/)", "info", names, "-")


def run_steps(
    group: list[Step],
    args,
    work: Path,
    env: dict,
    end: float,
    begin: float,
    rows: list[Row],
    log,
    reserve: float = 0.0,
) -> None:
    """Run one group of steps (side by side), ``reserve`` seconds left before ``end`` for the later
    steps; add their rows and append their output to ``log``."""
    for step in group:
        mode = " (dry run: collect / parse only)" if args.dry_run else ""
        print(f"[{time.monotonic() - begin:5.0f} s] {step.name}{mode}: {shlex.join(step.argv)}", flush=True)
    for step, outcome in zip(group, run_group(group, work, env, end, args.dry_run, reserve), strict=True):
        new = dry_rows(step, outcome) if args.dry_run else step.rows(step, outcome)
        rows += new
        status = outcome.note or ("timeout" if outcome.returncode is None else f"exit {outcome.returncode}")
        print(
            f"[{time.monotonic() - begin:5.0f} s] {step.name}: {status}; "
            + "; ".join(f"{r.result} {r.value}" for r in new),
            flush=True,
        )
        log.write(f"\n===== {step.name}: {shlex.join(step.argv)}\n===== {status}, {outcome.seconds:.0f} s\n")
        log.write(outcome.log.read_text(errors="replace") if outcome.log.is_file() else "(no output)\n")
        log.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="results/gpu_check", help="folder for the table, logs and JSON")
    parser.add_argument("--budget", type=float, default=540, help="seconds for all steps together")
    parser.add_argument("--workers", type=int, default=4, help="pytest-xdist workers for the compiled tests")
    parser.add_argument("--cuda-layers", type=int, default=8, help="layers of the Llama-2-7B shape")
    parser.add_argument("--overhead-layers", type=int, default=4, help="layers of the SmolLM2 shape")
    parser.add_argument("--dry-run", action="store_true", help="list the steps and parse their command lines")
    parser.add_argument(
        "--steps", default=",".join(STEP_NAMES), help=f"steps to run, of {','.join(STEP_NAMES)}"
    )
    parser.add_argument(
        "--select",
        default=None,
        help="pytest -k expression for the test steps (a short rerun, with --steps)",
    )
    parser.add_argument(
        "--methods", default=",".join(OVERHEAD_METHODS), help="bench_overhead's methods (comma-separated)"
    )
    args = parser.parse_args(argv)
    unknown = set(args.steps.split(",")) - set(STEP_NAMES)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; the steps are {','.join(STEP_NAMES)}")
    return args


def main() -> int:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvbench-gpu-check-"))
    try:
        return check(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check(args: argparse.Namespace, work: Path) -> int:
    """Every step, then the table; ``work`` holds the logs, reports and carried packages."""
    begin = time.monotonic()
    end = begin + args.budget
    out_dir = Path(args.out).resolve()
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    rows: list[Row] = []
    if (wheel_row := install_wheels(env, work)) is not None:
        rows.append(wheel_row)
    probe = subprocess.run([PY, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        print(f"error: {PY} cannot import torch: {last}", file=sys.stderr)
        return 2
    info = json.loads(probe.stdout)
    if not info["cuda"] and not args.dry_run:
        print(
            "error: no CUDA device (torch.cuda.is_available() is False); scripts/gpu_check.sh needs a GPU "
            "(--dry-run lists its steps on any machine)",
            file=sys.stderr,
        )
        return 2
    versions = ", ".join(f"{k} {info[k]}" for k in ("python", "torch", "triton", "transformers"))
    rows.insert(0, Row("device", "info", f"{info['gpu'] or 'no GPU'}; {versions}", "-"))
    missing = [k for k in ("triton", "omegaconf", "hydra", "platformdirs") if not info[k]]
    if missing:
        rows.append(Row("python packages", "FAIL", "missing: " + ", ".join(missing), "scripts/gpu_wheels.sh"))
    plan = steps(args, work, out_dir, info)
    env["KVBENCH_RANDOM_WEIGHTS"] = str(work / "smollm2-2layers.json")
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "steps.log").open("w") as log:
        chosen, by_name = args.steps.split(","), {step.name: step for step in plan}
        groups = [[by_name[n] for n in group if n in chosen] for group in STEP_GROUPS]
        groups = [group for group in groups if group]
        for i, group in enumerate(groups):
            reserve = sum(step.need for later in groups[i + 1 :] for step in later)
            run_steps(group, args, work, env, end, begin, rows, log, reserve)
    total = time.monotonic() - begin
    failed = [r for r in rows if r.result not in ("pass", "info", "dry-run")]
    rows.append(Row("total", "FAIL" if failed else "pass", f"{total:.0f} s", "< 600 s"))
    text = table(rows)
    (out_dir / "summary.md").write_text(text + "\n")
    (out_dir / "summary.json").write_text(
        json.dumps({"rows": [asdict(r) for r in rows], "info": info}, indent=2)
    )
    print(f"\nsteps' output: {out_dir / 'steps.log'}; table: {out_dir / 'summary.md'}\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
