"""What identifies a model's weights, read without loading them: a content hash of its files, a
GGUF's own metadata (``general.name``, quantisation type), a hub commit, and the identity a
converted GGUF folder carries with it (``kvbench_source.json``).

Content hashes are full SHA-256 digests of the bytes, cached per file by (path, size, mtime) under
``<cache_dir>/hashes``: the first use of a file reads it once (about 2 s per GB), later uses are
free, and a file changed in place (another size or mtime) is hashed again. A GGUF's ``general.*``
name and quantisation are cached the same way (its header, a vocabulary included, takes seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from tasks.errors import KVBenchError

#: The file a converted GGUF folder records its source in (read back by ``model=hf`` on the folder).
SOURCE_FILE = "kvbench_source.json"


def _cache_file(cache: Path, key: str) -> Path:
    return cache / "hashes" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _cached(paths: Sequence[Path], cache: Path, kind: str, compute: Callable[[], object]) -> object:
    """``compute()``, cached under ``cache`` by kind and each file's resolved path, size and mtime
    (in this process and on disk: a file changed in place is read again).

    Raises
    ------
    KVBenchError
        If a file cannot be read.
    """
    try:
        stats = [(str(Path(p).resolve()), os.stat(p)) for p in paths]
    except OSError as err:
        raise KVBenchError(f"cannot read {err.filename}: {err.strerror}") from err
    key = json.dumps([[name, st.st_size, st.st_mtime_ns] for name, st in stats])
    names = json.dumps([name for name, _ in stats])
    entry = _cache_file(cache, names if kind == "sha256" else f"{kind} {names}")  # one entry per path
    if (kind, key) in _SEEN:
        return _SEEN[kind, key]
    try:
        cached = json.loads(entry.read_text(encoding="utf-8"))
        if cached.get("key") == key:
            _SEEN[kind, key] = cached[kind]
            return cached[kind]
    except (OSError, ValueError, KeyError):
        pass
    value = _SEEN[kind, key] = compute()
    try:
        from runners.results.store import atomic_write_text

        atomic_write_text(entry, json.dumps({"key": key, kind: value}) + "\n")
    except OSError:  # a read-only cache only costs the read next time
        pass
    return value


_SEEN: dict[tuple[str, str], object] = {}


def content_sha256(paths: Sequence[Path], cache: Path) -> str:
    """SHA-256 of the concatenated bytes of ``paths`` (one file, or the parts of a split GGUF),
    cached by each file's resolved path, size and mtime (see the module docstring).

    Raises
    ------
    KVBenchError
        If a file cannot be read.
    """

    def digest() -> str:
        sha = hashlib.sha256()
        for path in paths:
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    sha.update(chunk)
        return sha.hexdigest()

    return str(_cached(paths, cache, "sha256", digest))


def folder_sha256(folder: Path, cache: Path) -> str:
    """SHA-256 over the names and content hashes of a model folder's files (top level, hidden
    files and :data:`SOURCE_FILE` left out), e.g. a ``save_pretrained`` folder."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    lines = [f"{p.name} {content_sha256([p], cache)}" for p in files if p.name != SOURCE_FILE]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def gguf_metadata(path: Path) -> dict[str, object]:
    """The scalar and string ``general.*`` metadata of a GGUF file (``general.name``,
    ``general.file_type``, ...), read from its header by ``gguf.GGUFReader`` (which maps the file;
    no tensor is read, so the first part of a GGUF split into packages reads too); arrays are left out.

    Raises
    ------
    KVBenchError
        If the file is not a readable GGUF.
    """
    from gguf import GGUFReader, GGUFValueType

    class HeaderReader(GGUFReader):
        """The header and tensor infos only: the tensor data may lie in later parts."""

        def _build_tensors(self, start_offs: int, fields: list) -> None:
            self.tensors = []

    try:
        fields = HeaderReader(path).fields
    except (OSError, ValueError, IndexError, MemoryError) as err:  # bad magic or version, a truncated file
        raise KVBenchError(f"cannot read the GGUF header of {path}: {type(err).__name__}: {err}") from err
    return {
        name: field.contents()
        for name, field in fields.items()
        if name.startswith("general.") and field.types[0] != GGUFValueType.ARRAY
    }


def quantization(file_type: object) -> str | None:
    """The name of a GGUF ``general.file_type`` (``3`` -> ``Q4_1``), None if absent or unknown."""
    if not isinstance(file_type, int):
        return None
    try:
        from gguf import LlamaFileType

        return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return f"file_type_{file_type}"


def gguf_identity(parts: Sequence[Path], cache: Path) -> dict:
    """A GGUF's identity: ``format`` ``gguf``, ``name`` (its ``general.name``), ``quantization``
    (``general.file_type``), ``sha256`` (of the whole file, the parts joined in order)."""

    def general() -> dict:  # the header's string table (a vocabulary) takes seconds to parse
        meta = gguf_metadata(parts[0])
        return {"name": meta.get("general.name"), "quantization": quantization(meta.get("general.file_type"))}

    meta = _cached(parts[:1], cache, "general", general)
    return {"format": "gguf", **meta, "sha256": content_sha256(parts, cache)}


def read_source(folder: Path) -> dict | None:
    """The ``{label, identity, ...}`` a converted folder recorded (:data:`SOURCE_FILE`), or None."""
    try:
        source = json.loads((Path(folder) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return source if isinstance(source, dict) and isinstance(source.get("identity"), dict) else None


def write_source(folder: Path, label: str, identity: dict, origin: str) -> None:
    """Record in a converted folder the model it holds: its ``label`` (the model name runs show),
    its ``identity`` and the ``origin`` it was converted from."""
    from runners.results.store import atomic_write_text

    text = json.dumps({"label": label, "identity": identity, "converted_from": origin}, indent=2)
    atomic_write_text(Path(folder) / SOURCE_FILE, text + "\n")
