"""The steps of ``scripts/gpu_check.py``: each step's command, the time it may take and how its outcome
becomes rows of the summary table (its parsers of pytest's JUnit XML and the benchmarks' JSON)."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PY = sys.executable
#: SmolLM2-135M-Instruct's configuration (the embedded model), for random weights of its shape.
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True, "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 2, "dtype": "float32",
}  # fmt: skip


@dataclass
class Row:
    """One line of the summary table."""

    check: str
    result: str  # pass, FAIL, error, timeout, skipped, info, dry-run
    value: str
    target: str


@dataclass
class Outcome:
    """How a step's process ended."""

    returncode: int | None  # None: killed at its time limit, or never started
    seconds: float
    log: Path
    note: str = ""


@dataclass
class Step:
    """A command, the time it may take and how its outcome becomes table rows."""

    name: str
    title: str
    argv: list[str]
    max_seconds: float
    need: float  # seconds the steps before it keep for it
    rows: Callable[[Step, Outcome], list[Row]]
    dry_run: list[str]  # the command that checks this step's command line without running it


def pytest_step(name: str, title: str, tests: list[str], work: Path, extra: list[str], **kw) -> Step:
    """A pytest run on CUDA (``scripts/cuda_tests.py``) whose counts come from its JUnit XML."""
    xml = work / f"{name}.xml"
    base = [PY, "-m", "pytest", "-p", "scripts.cuda_tests", "-p", "no:cacheprovider", *tests, *extra]
    return Step(
        name,
        title,
        [*base, "-v", "-rfE", f"--junitxml={xml}"],
        rows=lambda step, out: pytest_rows(title, xml, out),
        dry_run=[*base, "--collect-only", "-q"],
        **kw,
    )


def pytest_rows(title: str, xml: Path, out: Outcome) -> list[Row]:
    """The table row of a pytest step: counts from its JUnit XML ``xml``, or from its verbose log
    when it was killed before writing it."""
    log = out.log.read_text(errors="replace") if out.log.is_file() else ""
    if xml.is_file():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    else:  # killed before pytest wrote its report: count the verbose lines
        count = {s: len(re.findall(rf"\b{s}\b", log)) for s in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
        passed, n = count["PASSED"], {"failures": count["FAILED"], "errors": count["ERROR"], "skipped": 0}
        n["skipped"] = count["SKIPPED"]
    value = f"{passed} passed, {n['failures']} failed, {n['errors']} errors"
    value += f", {n['skipped']} skipped" if n["skipped"] else ""
    value += f"; {out.seconds:.0f} s"
    ok = out.returncode == 0 and passed > 0 and not n["skipped"]
    return [Row(title, verdict(out, ok), value, "all pass, none skipped")]


def verdict(out: Outcome, ok: bool) -> str:
    """A row's result: ``skipped`` or ``timeout`` for a step that did not end, else ``pass`` or ``FAIL``
    by ``ok``."""
    if out.returncode is None:
        return "skipped" if out.note else "timeout"
    return "pass" if ok else "FAIL"


def load_json(path: Path) -> dict:
    """The JSON object a benchmark wrote at ``path``; ``{}`` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def bench_cuda_rows(path: Path, args) -> Callable[[Step, Outcome], list[Row]]:
    """The rows of ``scripts/bench_cuda.py``'s targets (a), (c), (d) from its JSON at ``path``; a
    missing part gets a row saying why."""
    layers = f"Llama-2-7B shape, {args.cuda_layers} layers, batch 8"

    def a_row(a: dict) -> Row:
        ms = f"{a['ours_fullkv_ms']:.2f} vs {a['transformers_static_compiled_ms']:.2f} ms/step"
        return Row(
            f"(a) compiled FullKV step vs transformers static+compile ({layers})",
            "pass" if a["ratio"] <= a["target"] else "FAIL",
            f"{a['ratio']:.3f}x ({ms})",
            "<= 1.2x",
        )

    def c_row(c: dict) -> Row:
        rate = c["tokens_per_s"]
        return Row(
            "(c) ZSMerge at 5% vs FullKV tokens/s, 2048 + 2048 tokens",
            "pass" if c["speedup"] >= c["paper"] else "FAIL",
            f"{c['speedup']:.2f}x ({rate['zsmerge']:.0f} vs {rate['fullkv']:.0f} tokens/s)",
            ">= 1.47x (ZSMerge Table 1)",
        )

    def d_row(d: dict) -> Row:
        share = 100 * d["achieved_gb_s"] / d["peak_gb_s"]
        value = f"{d['achieved_gb_s']:.0f} GB/s ({share:.0f}% of peak), {d['step_ms']:.2f} ms/step"
        peak = f"peak {d['peak_gb_s']:.0f} GB/s"
        return Row("(d) achieved bandwidth of a FullKV step", "info", value, peak)

    #: part -> (its row from the bench's result, the title and target of its row when it is missing)
    parts = {
        "a": (a_row, "(a) compiled FullKV step vs transformers static+compile", "<= 1.2x"),
        "c": (c_row, "(c) ZSMerge at 5% vs FullKV tokens/s", ">= 1.47x (ZSMerge Table 1)"),
        "d": (d_row, "(d) achieved bandwidth of a FullKV step", "report"),
    }

    def rows(step: Step, out: Outcome) -> list[Row]:
        data = load_json(path)
        missing = verdict(out, False) if out.returncode is None else "error"
        return [
            row(data[key]) if data.get(key) is not None else Row(title, missing, "-", target)
            for key, (row, title, target) in parts.items()
        ]

    return rows


def overhead_rows(path: Path, methods: list[str], layers: int) -> Callable[[Step, Outcome], list[Row]]:
    """One row per method of ``scripts/bench_overhead.py``'s JSON at ``path``: its compiled decode
    step over FullKV's against its target."""

    def rows(step: Step, out: Outcome) -> list[Row]:
        done = load_json(path).get("overhead", {})
        missing = verdict(out, False) if out.returncode is None else "error"
        result = []
        for name in methods:
            title = f"{name} decode step / FullKV's (compiled, SmolLM2 {layers} layers, B=512)"
            if (r := done.get(name)) is None or "error" in r:
                result.append(Row(title, "error" if r else missing, r["error"][:90] if r else "-", "-"))
                continue
            target = r["target"]
            ok = target is None or r["ratio"] <= target
            value = f"{r['ratio']:.3f}x ({r['step_ms']:.2f} vs {r['fullkv_step_ms']:.2f} ms)"
            result.append(Row(title, "pass" if ok else "FAIL", value, f"<= {target:.2f}x" if target else "-"))
        return result

    return rows


def ragged_rows(path: Path, title: str) -> Callable[[Step, Outcome], list[Row]]:
    """The two rows of ``scripts/bench_ragged.py``'s JSON at ``path``: ragged over uniform heads on
    the Triton kernel and on the PyTorch path."""

    def rows(step: Step, out: Outcome) -> list[Row]:
        row = (load_json(path).get("rows") or [{}])[0] if out.returncode == 0 else {}
        missing = verdict(out, False) if out.returncode is None else "error"
        result = []
        for name, label in (("triton", "Triton kernel"), ("torch", "PyTorch path")):
            check = f"ragged / uniform heads, {label}, equal total slots ({title})"
            if (ratio := row.get(f"{name}_ratio")) is None:
                result.append(Row(check, missing, "-", "report"))
                continue
            value = f"{ratio:.2f}x ({row[f'{name}_ragged_ms']:.3f} vs {row[f'{name}_uniform_ms']:.3f} ms)"
            result.append(Row(check, "info", value, "report"))
        return result

    return rows


def steps(args, work: Path, out_dir: Path, info: dict) -> list[Step]:
    """The steps in order; each keeps its ``need`` free for itself from the steps before it. Writes the
    random-weights configurations into ``work`` (``smollm2-2layers.json`` stands in for the
    embedded model in the tests)."""
    cfg_small, cfg_overhead = (
        work / "smollm2-2layers.json",
        work / f"smollm2-{args.overhead_layers}layers.json",
    )
    cfg_small.write_text(json.dumps(SMOLLM2 | {"num_hidden_layers": 2}, indent=2))
    cfg_overhead.write_text(json.dumps(SMOLLM2 | {"num_hidden_layers": args.overhead_layers}, indent=2))
    parallel = ["-n", str(args.workers)] if info.get("xdist") and args.workers > 1 else []
    methods = args.methods.split(",")
    select = args.select

    def picked(own: str | None = None) -> list[str]:
        """A test step's ``-k``: its own expression and ``--select`` together."""
        both = [f"({e})" for e in (own, select) if e]
        return ["-k", " and ".join(both)] if both else []

    cuda_json, overhead_json = out_dir / "bench_cuda.json", out_dir / "bench_overhead.json"
    ragged_json = out_dir / "bench_ragged.json"
    ragged = ["scripts/bench_ragged.py", "--device", "cuda", "--shape", "llama3-8b", "--slots", "4096"]
    ragged += ["--batch", "8", "--dtype", "bfloat16", "--repeats", "100", "--json", str(ragged_json)]
    bench_cuda = ["scripts/bench_cuda.py", "--shape", "llama2-7b", "--layers", str(args.cuda_layers)]
    bench_cuda += ["--batch", "8", "--prompt", "2048", "--new", "2048", "--json", str(cuda_json)]
    overhead = ["scripts/bench_overhead.py", "--device", "cuda", "--backend", "compiled", "--random-weights"]
    overhead += [str(cfg_overhead), "--skip", "throughput", "--steps", "24", "--repeats", "2"]
    overhead += ["--methods", ",".join(methods), "--json", str(overhead_json)]
    checks = dict(max_seconds=240, need=240)
    return [
        pytest_step(
            "kernels",
            "Triton decode kernels == PyTorch paths (tests/test_kernels.py, tests/test_ragged_kernel.py)",
            ["tests/test_kernels.py", "tests/test_ragged_kernel.py"],
            work,
            picked(),
            **checks,
        ),
        pytest_step(
            "slot_bound",
            "slot bound never exceeded on CUDA (tests/test_method_matrix.py)",
            ["tests/test_method_matrix.py"],
            work,
            picked("budget_and_memory or allocated_memory"),
            **checks,
        ),
        pytest_step(
            "compiled",
            "compiled steps (CUDA graphs) == eager tokens (tests/test_compiled.py)",
            ["tests/test_compiled.py"],
            work,
            parallel + picked(),
            **checks,
        ),
        Step(
            "bench_cuda",
            "scripts/bench_cuda.py: targets (a), (c), (d)",
            [PY, *bench_cuda],
            180,
            150,
            bench_cuda_rows(cuda_json, args),
            [PY, "-c", PARSE, *bench_cuda],
        ),
        Step(
            "bench_ragged",
            "scripts/bench_ragged.py: ragged vs uniform heads",
            [PY, *ragged],
            60,
            30,
            ragged_rows(ragged_json, "Llama-3-8B shape, 4096 slots/head, batch 8, bf16"),
            [PY, "-c", PARSE, *ragged],
        ),
        Step(
            "bench_overhead",
            "scripts/bench_overhead.py: decode-step overhead, compiled",
            [PY, *overhead],
            600,
            90,
            overhead_rows(overhead_json, methods, args.overhead_layers),
            [PY, "-c", PARSE, *overhead],
        ),
    ]


#: bench_overhead's methods: one of each family (eviction, merging, LESS) and the ones with their own step.
OVERHEAD_METHODS = ("h2o", "snapkv", "streamingllm", "zsmerge", "kvmerger", "keepkv", "less")
#: The steps by group, in the order they run (a group's steps side by side; ``--steps`` picks some).
STEP_GROUPS = (("kernels", "slot_bound", "compiled"), ("bench_cuda",), ("bench_ragged",), ("bench_overhead",))
STEP_NAMES = tuple(name for group in STEP_GROUPS for name in group)

#: Imports a script and parses a command line with its ``parse_args`` (the dry run of a benchmark).
PARSE = """import importlib.util, sys
spec = importlib.util.spec_from_file_location("step", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.parse_args(sys.argv[2:]))"""
