"""Provenance and memory facts recorded with every run."""

from __future__ import annotations

import ctypes
import gc
import platform
import resource
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("kvbench", "torch", "transformers", "hydra-core", "rouge-score", "datasets", "wandb")


def git_sha() -> str | None:
    """Commit of the KVBench checkout (with ``-dirty`` if modified), or None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("-dirty" if dirty else "")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that determine results."""
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo`` ``model name``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: torch.device) -> dict:
    """What the run ran on: CUDA device name and index, or CPU model and thread count."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {"type": "cuda", "index": index, "name": torch.cuda.get_device_name(index)}
    return {"type": "cpu", "name": cpu_model(), "threads": torch.get_num_threads()}


def _proc_status(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (Linux), or None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: Peaks of the windows :func:`reset_peak_memory` closed (``"rss"`` or a CUDA device name ->
#: bytes): what the process peaks add to the current window's.
_CLOSED_PEAKS: dict[str, int] = {}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (bytes) since the last :func:`reset_peak_memory`
    (Linux ``VmHWM``), or since start (``ru_maxrss``) where that cannot be reset."""
    hwm = _proc_status("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def process_peak_rss_bytes() -> int:
    """Peak resident set size of this process since it started (bytes): model loading and earlier
    jobs of the same process included, across every :func:`reset_peak_memory`."""
    return max(_CLOSED_PEAKS.get("rss", 0), peak_rss_bytes())


def process_peak_device_bytes(device: torch.device) -> int | None:
    """CUDA ``max_memory_allocated`` of ``device`` since the process started (bytes), across every
    :func:`reset_peak_memory`; None on CPU."""
    if device.type != "cuda":
        return None
    return max(_CLOSED_PEAKS.get(str(device), 0), torch.cuda.max_memory_allocated(device))


def rss_bytes() -> int | None:
    """Current resident set size of this process (bytes, Linux ``VmRSS``), or None."""
    return _proc_status("VmRSS")


def release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``), so memory
    a previous job of the same process freed is not counted in the next job's resident set."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window: CUDA peak stats, or the CPU peak RSS (writing ``5`` to
    ``/proc/self/clear_refs`` resets ``VmHWM``; a no-op where the kernel does not allow it). The
    closed window's peak is kept for :func:`process_peak_rss_bytes` / :func:`process_peak_device_bytes`."""
    if device.type == "cuda":
        _CLOSED_PEAKS[str(device)] = process_peak_device_bytes(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    _CLOSED_PEAKS["rss"] = process_peak_rss_bytes()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_device_bytes(device: torch.device) -> int | None:
    """CUDA ``max_memory_allocated`` (bytes), None on CPU."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
