"""Where KVBench caches models (converted GGUF folders, content hashes) and how a model's name
becomes one path component."""

from __future__ import annotations

import os
import re
from pathlib import Path

from platformdirs import user_cache_dir

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
