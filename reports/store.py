"""The result store: one directory per run with an atomically written record (docs/results.md),
and the run identity that names the runs. Runners write it, reports read it; it imports neither.

Layout under ``results_dir``::

    runs/<run_id>/record.json        the run record (written last, by rename: its presence
                                     means the run's files are complete)
    runs/<run_id>/predictions.jsonl  one line per sample
    table.csv, table.parquet         all records flattened (:func:`write_tables`)

A run id is ``<setting_id>-<inputs hash>``: the setting is what the config asks for
(:func:`setting_id`, computed from the config alone, as reports do without models or data), the
inputs are what the run read (the model's identity and a fingerprint of the task's samples), so
the same command on another model file or on changed data is another run, never "already finished".
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

SCHEMA_VERSION = 2
#: The form of a run id: 16 hex digits of the setting, 8 of the inputs (:func:`run_id`).
RUN_ID = re.compile(r"[0-9a-f]{16}-[0-9a-f]{8}")
IDENTITY_KEYS = ("model", "method", "task", "runner", "budget", "budget_unit", "seed")
NON_IDENTITY_TASK_KEYS = ("data_dir",)
NON_IDENTITY_RUNNER_KEYS = ("progress",)  # display only: a progress bar does not make another run
#: Runners whose ``runner.batch_size`` was named ``runner.batch`` when their first runs were stored:
#: their identity hashes it under that old key, so those runs keep their ids.
BATCH_KEY_WAS_BATCH = ("efficiency", "oom")
#: Options renamed since runs were first stored: old name -> new name. ``run.py`` refuses the old
#: name with one error line; :meth:`ResultStore.read` shows an old record under the new names.
RENAMED_OPTIONS = {"runner.batch": "runner.batch_size"}
#: The same renames inside a record: (path of the mapping in the record, old key, new key).
RENAMED_RECORD_KEYS = (
    (("config", "runner"), "batch", "batch_size"),
    (("shape",), "batch", "batch_size"),  # efficiency and OOM records' prompt shape
)


def run_identity(config: dict) -> dict:
    """The part of a resolved config that defines a run (paths, loggers and data location excluded;
    ``task.query_aware=true``, the whole prompt compressed, ``runner.batch_size=1`` and one shard
    (``runner.num_shards=1``) are left out: runs stored before these options existed did that, and
    keep their ids; the efficiency and OOM runners' ``runner.batch_size`` is hashed as ``batch``, its
    name when their runs were stored)."""
    identity = {k: config.get(k) for k in IDENTITY_KEYS}
    identity["task"] = {
        k: v for k, v in (config.get("task") or {}).items() if k not in NON_IDENTITY_TASK_KEYS
    }
    if identity["task"].get("query_aware") is True:  # the whole prompt compressed: what runs did before
        del identity["task"]["query_aware"]  # the switch existed, so their ids stay
    if isinstance(config.get("runner"), dict):
        runner = {k: v for k, v in config["runner"].items() if k not in NON_IDENTITY_RUNNER_KEYS}
        if runner.get("name") in BATCH_KEY_WAS_BATCH and "batch_size" in runner:
            runner["batch"] = runner.pop("batch_size")  # stored runs hashed it as runner.batch
        elif runner.get("batch_size") == 1:  # one prompt at a time: what runs did before
            del runner["batch_size"]  # the option existed, so their ids stay
        if runner.get("num_shards") == 1 and runner.get("shard_index") == 0:  # unsharded: ids stay
            del runner["num_shards"], runner["shard_index"]
        identity["runner"] = runner
    if config.get("kernels", "auto") != "auto":  # a forced decode backend is another run
        identity["kernels"] = config["kernels"]
    if config.get("backend", "eager") != "eager":  # compiled decode steps are another run
        identity["backend"] = config["backend"]
    if quant_of(config) != "none":  # quantized storage is another run; none keeps the ids before quant=
        identity["quant"] = config["quant"]
    return identity


def quant_of(config: dict) -> str:
    """The ``quant.name`` of a config, a record's dict or a run's DictConfig (``none`` without the
    group: runs stored before the option)."""
    return str((config.get("quant") or {}).get("name", "none"))


def renamed_override(overrides: list[str]) -> str | None:
    """The error message for the first command-line override naming a renamed option
    (:data:`RENAMED_OPTIONS`, with or without a ``+``, ``++`` or ``~`` prefix), else None."""
    for item in overrides:
        key, assigns, value = item.partition("=")
        new = RENAMED_OPTIONS.get(key.lstrip("~+"))
        if new is not None:
            return f"{key.lstrip('~+')} is now {new}" + (f" (write {new}={value})" if assigns else "")
    return None


def renamed_in_config(cfg: DictConfig) -> str | None:
    """The error message for a composed config that still sets a renamed option (a config file
    written before the rename: the option would be silently ignored), else None."""
    for old, new in RENAMED_OPTIONS.items():
        if OmegaConf.select(cfg, old, default=None) is not None:
            return f"{old} is now {new}: a config file still sets {old}; rename it there"
    return None


def upgrade_record(record: dict) -> dict:
    """``record`` (in place, and returned) under the current names of :data:`RENAMED_RECORD_KEYS`:
    a record stored before a rename reads as a new one (``config.runner.batch`` and ``shape.batch``
    of efficiency and OOM runs become ``batch_size``). The file on disk is left as it is."""
    for path, old, new in RENAMED_RECORD_KEYS:
        node = record
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and old in node and new not in node:
            node[new] = node.pop(old)
    return record


def _digest(value: object, digits: int) -> str:
    blob = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:digits]


def setting_id(config: dict) -> str:
    """Stable 16-hex-digit id of what a resolved config asks for: SHA-256 of its
    :func:`run_identity` (no model or data read: reports compute it from configs)."""
    return _digest(run_identity(config), 16)


def run_id(config: dict, inputs: dict | None = None) -> str:
    """The id a run is stored under: ``<setting_id>-<8 hex digits of SHA-256 over inputs>``.

    Parameters
    ----------
    config : dict
        The resolved config (:func:`run_config`).
    inputs : dict | None
        What the run read (``runners.record.run_inputs``: ``model`` identity, ``data``
        fingerprint). None only for a record that does not say (schema 1): its id is the
        setting id alone, which no new run is stored under, so such records are never replaced.
    """
    sid = setting_id(config)
    return sid if inputs is None else f"{sid}-{_digest(inputs, 8)}"


# Which parts of the config identify a run, per runner: (the task, the top-level budget). Efficiency
# and OOM runs use synthetic prompts (no task); the error runner sweeps runner.budgets itself.
IDENTITY_RULES: dict[str, tuple[bool, bool]] = {
    "efficiency": (False, True),
    "oom": (False, True),
    "error": (True, False),
}


def run_config(cfg: DictConfig, budget_applies: bool = True) -> dict:
    """The resolved config a run is stored under (docs/results.md): ``task`` is null for runners
    without one, ``budget`` null where it does not apply (FullKV, the error runner's own budgets).

    Parameters
    ----------
    cfg : DictConfig
        The composed job config.
    budget_applies : bool
        False for a method that ignores the budget (``Traits.budget_applies``).
    """
    config = OmegaConf.to_container(cfg, resolve=True)
    uses_task, uses_budget = IDENTITY_RULES.get(cfg.runner.name, (True, True))
    if not uses_task:
        config["task"] = None
    if not (uses_budget and budget_applies):
        config["budget"] = None
    return config


def setting_of(rid: str) -> str:
    """The setting part of run id ``rid`` (:func:`run_id`: ``<setting id>-<inputs hash>``); an id of
    another form (a schema-1 record's setting id alone, a hand-made id) is its own setting."""
    return rid.split("-", 1)[0] if RUN_ID.fullmatch(rid) else rid


def by_age(records: list[dict]) -> list[dict]:
    """``records`` oldest first (``created``, then run id)."""
    return sorted(records, key=lambda r: (str(r.get("created") or ""), r["run_id"]))


def newest(records: list[dict]) -> dict | None:
    """The record reports show of several records of one setting: the newest (:func:`by_age`)
    finished (``ok``) one, else the newest of any status; None for no records."""
    ordered = by_age(records)
    done = [r for r in ordered if r.get("status") == "ok"]
    return (done or ordered or [None])[-1]


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
