"""Trained LESS kernel sets on disk: one per (model, sparse policy, budget), with metadata.

Layout: ``<checkpoints_dir>/less/<model>__<policy>__<budget><unit>/`` holding ``kernels.safetensors``
(tensors named ``layer.<i>.<param>``) and ``meta.json`` (geometry, training data, steps,
validation loss per layer). Kernels are tied to the policy and budget they were trained with
(docs/methods.md, "LESS").
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from methods.less.kernels import LessKernels


def kernel_set_name(model: str, policy: str, budget: float | int, budget_unit: str = "prompt") -> str:
    """Directory name of a kernel set, e.g. ``smollm2-135m__h2o__0.1prompt``."""
    return f"{model}__{policy}__{budget}{budget_unit}"


def kernel_set_dir(checkpoints_dir: str | Path, model: str, policy: str, budget, budget_unit: str) -> Path:
    """Where the kernel set of (model, policy, budget) lives."""
    return Path(checkpoints_dir) / "less" / kernel_set_name(model, policy, budget, budget_unit)


def save_kernel_set(directory: Path, kernels: list[LessKernels], meta: dict) -> None:
    """Write ``kernels.safetensors`` then ``meta.json`` (atomically: a set without meta is unfinished)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"layer.{i}.{k}": v.detach().contiguous()
        for i, ks in enumerate(kernels)
        for k, v in ks.state_dict().items()
    }
    save_file(tensors, directory / "kernels.safetensors")
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(tmp, directory / "meta.json")


def load_kernel_set(directory: Path) -> tuple[list[LessKernels], dict]:
    """Kernels (eval mode) and metadata of a finished set.

    Raises
    ------
    FileNotFoundError
        If the set does not exist or is unfinished (no ``meta.json``).
    """
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(str(directory))
    meta = json.loads(meta_path.read_text())
    tensors = load_file(directory / "kernels.safetensors")
    g = meta["geometry"]
    kernels = []
    for i in range(g["num_layers"]):
        ks = LessKernels(g["q_heads"], g["kv_heads"], g["head_dim"], rank=g["rank"], hidden=g["hidden"])
        ks.load_state_dict(
            {k.removeprefix(f"layer.{i}."): v for k, v in tensors.items() if k.startswith(f"layer.{i}.")}
        )
        kernels.append(ks.eval().requires_grad_(False))
    return kernels, meta


def save_layer(directory: Path, layer: int, kernels: LessKernels, info: dict) -> None:
    """Store one layer's trained kernels under ``partial/`` (layers may train in separate jobs)."""
    part = directory / "partial"
    part.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().contiguous() for k, v in kernels.state_dict().items()},
        part / f"layer_{layer}.safetensors",
    )
    (part / f"layer_{layer}.json").write_text(json.dumps(info))


def assemble_kernel_set(directory: Path, geometry: dict, meta: dict) -> bool:
    """Write the finished set once every layer's partial exists; returns whether it did.

    ``meta`` gets ``layers``: each layer's training info (validation loss, curve, data).
    """
    part = directory / "partial"
    n = geometry["num_layers"]
    if not all((part / f"layer_{i}.json").is_file() for i in range(n)):
        return False
    kernels = []
    for i in range(n):
        ks = LessKernels(
            geometry["q_heads"],
            geometry["kv_heads"],
            geometry["head_dim"],
            geometry["rank"],
            geometry["hidden"],
        )
        ks.load_state_dict(load_file(part / f"layer_{i}.safetensors"))
        kernels.append(ks)
    layers = {i: json.loads((part / f"layer_{i}.json").read_text()) for i in range(n)}
    save_kernel_set(directory, kernels, {**meta, "geometry": geometry, "layers": layers})
    return True
