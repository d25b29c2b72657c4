"""The GGUF model sources (``runners.models.sources``): ``gguf``, a ``.gguf`` file converted once
and cached keyed by its content, and ``embedded_gguf``, a GGUF shipped in PyPI packages (parts joined
in order) cached under the model's name. Each is located, identified and named here."""

from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import DictConfig

from runners.models.gguf import convert_gguf, package_files
from runners.models.identity import SOURCE_FILE, gguf_identity, read_source, write_source
from runners.models.paths import cache_dir, safe_name
from tasks.errors import KVBenchError


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
    """The converted folder of a ``.gguf`` file, keyed by its content (:func:`gguf_file_identity`): a
    copy reuses the folder of the original; a folder converted by earlier versions (keyed by
    the file's path, size and mtime) is adopted, not converted again.

    Raises
    ------
    KVBenchError
        If the file does not exist, is not a ``.gguf`` or cannot be converted.
    """
    path = _gguf_path(cfg)
    identity = gguf_file_identity(cfg)
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


def embedded_identity(cfg: DictConfig) -> dict:
    """The identity of the packaged GGUF, or the one its converted folder recorded when the
    packages are gone."""
    if _packages_installed(cfg):
        return gguf_identity(embedded_files(cfg), cache_dir())
    source = read_source(cache_dir() / "models" / safe_name(cfg.name))
    return source["identity"] if source else {"format": "gguf", "package": str(cfg.package), "sha256": None}


def embedded_present(cfg: DictConfig) -> None:
    """The embedded GGUF's packages are installed, unless the model is converted already.

    Raises
    ------
    KVBenchError
        If a package or its GGUF file is missing.
    """
    if not (cache_dir() / "models" / safe_name(cfg.name) / "config.json").is_file():
        embedded_files(cfg)


def gguf_name(cfg: DictConfig) -> str:
    """The name of a converted folder of the same content if one exists, else ``<general.name>-
    <quantization>`` from the header (the file name without ``.gguf`` if it names no model)."""
    identity = gguf_file_identity(cfg)
    found = _converted(identity)
    if found is not None and (label := (read_source(found) or {}).get("label")):
        return label
    return _gguf_label(_gguf_path(cfg), identity)


def gguf_file_identity(cfg: DictConfig) -> dict:
    """A ``.gguf`` file's identity (``runners.models.identity.gguf_identity``)."""
    return gguf_identity([_gguf_path(cfg)], cache_dir())
