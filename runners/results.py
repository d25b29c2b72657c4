"""The result store: one directory per run with an atomically written record (docs/results.md).

Layout under ``results_dir``::

    runs/<run_id>/record.json        the run record (written last, by rename: its presence
                                     means the run's files are complete)
    runs/<run_id>/predictions.jsonl  one line per sample
    table.csv, table.parquet         all records flattened (runners.loggers.TableLogger)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

SCHEMA_VERSION = 1
IDENTITY_KEYS = ("model", "method", "task", "runner", "budget", "budget_unit", "seed")
NON_IDENTITY_TASK_KEYS = ("data_dir",)
NON_IDENTITY_RUNNER_KEYS = ("progress",)  # display only: a progress bar does not make another run


def run_identity(config: dict) -> dict:
    """The part of a resolved config that defines a run (paths, loggers and data location excluded)."""
    identity = {k: config.get(k) for k in IDENTITY_KEYS}
    identity["task"] = {
        k: v for k, v in (config.get("task") or {}).items() if k not in NON_IDENTITY_TASK_KEYS
    }
    if isinstance(config.get("runner"), dict):
        identity["runner"] = {k: v for k, v in config["runner"].items() if k not in NON_IDENTITY_RUNNER_KEYS}
    if config.get("kernels", "auto") != "auto":  # a forced decode backend is another run
        identity["kernels"] = config["kernels"]
    return identity


def run_id(config: dict) -> str:
    """Stable 16-hex-digit id: SHA-256 of the run identity of a resolved config."""
    blob = json.dumps(run_identity(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultStore:
    """Records of finished, failed and OOM runs under one directory.

    Parameters
    ----------
    root : str | Path
        The ``results_dir``.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def run_dir(self, rid: str) -> Path:
        """Directory of one run."""
        return self.root / "runs" / rid

    def read(self, rid: str) -> dict | None:
        """The record of run ``rid``, or None if there is none."""
        path = self.run_dir(rid) / "record.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def finished(self, rid: str) -> dict | None:
        """The record of run ``rid`` if it finished with status ``ok``."""
        record = self.read(rid)
        return record if record is not None and record.get("status") == "ok" else None

    def write(self, record: dict, predictions: list[dict]) -> Path:
        """Write predictions, then the record (atomically, last). Returns the record's path."""
        run_dir = self.run_dir(record["run_id"])
        lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
        atomic_write_text(run_dir / "predictions.jsonl", lines)
        path = run_dir / "record.json"
        atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        return path

    def records(self) -> list[dict]:
        """Every readable record in the store, ordered by run id."""
        out = []
        for path in sorted((self.root / "runs").glob("*/record.json")):
            try:
                out.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, json.JSONDecodeError):
                continue
        return out

    def reindex(self) -> list[tuple[str, str]]:
        """Move every record whose stored run id is not the id its config has under the current
        :func:`run_identity` (a store written before the identity rules changed) to its current id,
        unless a record already sits there. Returns the ``(old, new)`` ids moved."""
        moved = []
        for record in self.records():
            old, new = record["run_id"], run_id(record["config"])
            if old == new or self.run_dir(new).exists():
                continue
            self.run_dir(old).rename(self.run_dir(new))
            atomic_write_text(
                self.run_dir(new) / "record.json",
                json.dumps(record | {"run_id": new}, indent=2, sort_keys=True, default=str) + "\n",
            )
            moved.append((old, new))
        return moved
