"""The result store: one directory per run with an atomically written record (docs/results.md);
the run identity that names the runs is ``runners.results.identity`` (its names are re-exported here).
Runners write the store, reports read it; it imports neither.

Layout under ``results_dir``::

    runs/<run_id>/record.json        the run record (written last, by rename: its presence
                                     means the run's files are complete)
    runs/<run_id>/predictions.jsonl  one line per sample
    table.csv, table.parquet         all records flattened (:func:`write_tables`)
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from pathlib import Path

from runners.results.identity import (  # noqa: F401  (re-exported: the store's public names)
    BATCH_KEY_WAS_BATCH,
    IDENTITY_KEYS,
    IDENTITY_RULES,
    NON_IDENTITY_RUNNER_KEYS,
    NON_IDENTITY_TASK_KEYS,
    RENAMED_OPTIONS,
    RENAMED_RECORD_KEYS,
    RUN_ID,
    SCHEMA_VERSION,
    by_age,
    newest,
    quant_of,
    renamed_in_config,
    renamed_override,
    run_config,
    run_id,
    run_identity,
    setting_id,
    setting_of,
    upgrade_record,
)


def _file_mode() -> int:
    """``0o666`` less the process umask: the mode ``open()`` would give a new file (0644 usually)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a uniquely named temporary file in the same directory, fsync and
    ``os.replace`` (concurrent writers never share a temp file; readers see the old or the new
    file, never a part). The file gets the mode a plain ``open()`` would give it.

    Raises
    ------
    OSError
        If the directory cannot be written (the temp file is removed; ``path`` is untouched).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


class ResultStore:
    """Records of finished, failed and OOM runs under one directory.

    Parameters
    ----------
    root : str | Path
        The ``results_dir``.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        #: ``(path, reason)`` of every unreadable record met by :meth:`read` / :meth:`records`.
        self.corrupt: list[tuple[Path, str]] = []

    def run_dir(self, rid: str) -> Path:
        """Directory of one run."""
        return self.root / "runs" / rid

    def _load(self, path: Path) -> dict | None:
        """A record file's contents, or None (noted in :attr:`corrupt`, with a warning line on
        stderr) when it cannot be read or is not a record (truncated, not JSON, no ``run_id``)."""
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or "run_id" not in record or "status" not in record:
                raise ValueError("not a run record")
        except (OSError, ValueError) as err:  # JSONDecodeError is a ValueError
            reason = f"{type(err).__name__}: {err}".splitlines()[0]
            self.corrupt.append((path, reason))
            print(f"warning: unreadable record {path} ({reason}); treated as missing", file=sys.stderr)
            return None
        return upgrade_record(record)

    def read(self, rid: str) -> dict | None:
        """The record of run ``rid`` under the current option names (:func:`upgrade_record`), or
        None if there is none (or it is unreadable: see :meth:`_load`)."""
        path = self.run_dir(rid) / "record.json"
        return self._load(path) if path.is_file() else None

    def of_setting(self, sid: str) -> list[dict]:
        """Every readable record of setting ``sid`` (:func:`setting_id`): runs on any inputs, and
        a schema-1 record stored under the setting id alone; oldest first (``created``)."""
        paths = [self.run_dir(sid) / "record.json", *self.root.glob(f"runs/{sid}-*/record.json")]
        return by_age([r for p in paths if p.is_file() and (r := self._load(p)) is not None])

    def find(self, sid: str) -> dict | None:
        """The record reports show for setting ``sid`` (:func:`newest`), None if there is none
        (:meth:`of_setting` lists them all)."""
        return newest(self.of_setting(sid))

    def finished(self, rid: str) -> dict | None:
        """The record of run ``rid`` if it finished with status ``ok``."""
        record = self.read(rid)
        return record if record is not None and record.get("status") == "ok" else None

    def write(self, record: dict, predictions: list[dict]) -> Path:
        """Write predictions, then the record (atomically, last). Returns the record's path.

        A finished (``ok``) run is never replaced by a failed one: a non-``ok`` record for a run
        id that holds an ``ok`` record is not written (a warning says so) and the finished files
        stay byte for byte; an ``ok`` record (``rerun=true``) replaces them."""
        run_dir = self.run_dir(record["run_id"])
        path = run_dir / "record.json"
        if record.get("status") != "ok" and self.finished(record["run_id"]) is not None:
            print(
                f"warning: run {record['run_id']} ended with status {record.get('status')} "
                f"({record.get('error')}); its finished record {path} is kept",
                file=sys.stderr,
            )
            return path
        lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
        atomic_write_text(run_dir / "predictions.jsonl", lines)
        atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        return path

    def records(self) -> list[dict]:
        """Every readable record in the store, ordered by run id; unreadable ones are listed in
        :attr:`corrupt` (and reported on stderr), never silently dropped."""
        out = []
        for path in sorted((self.root / "runs").glob("*/record.json")):
            record = self._load(path)
            if record is not None:
                out.append(record)
        return out

    def reindex(self) -> list[tuple[str, str]]:
        """Move every record whose stored run id is not the id its config and inputs have under the
        current :func:`run_identity` (a store written before the identity rules changed) to its
        current id, unless a record already sits there. Returns the ``(old, new)`` ids moved."""
        moved = []
        for record in self.records():
            old, new = record["run_id"], run_id(record["config"], record.get("inputs"))
            if old == new or self.run_dir(new).exists():
                continue
            self.run_dir(old).rename(self.run_dir(new))
            path = self.run_dir(new) / "record.json"
            stored = json.loads(path.read_text(encoding="utf-8"))  # as written, old names kept
            atomic_write_text(
                path, json.dumps(stored | {"run_id": new}, indent=2, sort_keys=True, default=str) + "\n"
            )
            moved.append((old, new))
        return moved


def flat_summary(record: dict) -> dict:
    """One flat row of a record: identity columns (model, method, task, runner, budget and its unit,
    quant, seed), status and error, provenance (git sha, created), metrics and efficiency figures."""
    cfg = record.get("config") or {}
    row = {
        "run_id": record["run_id"],
        "status": record["status"],
        "error": record.get("error"),
        "model": (cfg.get("model") or {}).get("name"),
        "method": record.get("method"),
        "task": record.get("task"),
        "runner": (cfg.get("runner") or {}).get("name"),
        "budget": cfg.get("budget"),
        "budget_unit": cfg.get("budget_unit"),
        "quant": quant_of(cfg),
        "seed": cfg.get("seed"),
        "n_samples": record.get("n_samples"),
        "git_sha": record.get("git_sha"),
        "created": record.get("created"),
    }
    row.update(record.get("metrics") or {})
    row.update({k: v for k, v in (record.get("efficiency") or {}).items() if not isinstance(v, list)})
    method_cfg = {k: v for k, v in (cfg.get("method") or {}).items() if k != "_target_"}
    row.update({f"method.{k}": v for k, v in method_cfg.items()})
    return row


def write_tables(results_dir: str | Path) -> Path:
    """Rebuild ``table.csv`` and ``table.parquet`` from every record of the store (the records are
    the source of truth; each file is replaced atomically through a uniquely named temp file, so
    concurrent writers never collide and a reader never sees a half-written table). Returns the
    CSV's path."""
    import pandas as pd

    store = ResultStore(results_dir)
    frame = pd.DataFrame([flat_summary(r) for r in store.records()])
    atomic_write_text(store.root / "table.csv", frame.to_csv(index=False))
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(store.root / "table.parquet", buf.getvalue())
    return store.root / "table.csv"
