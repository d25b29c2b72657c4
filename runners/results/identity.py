"""Run identity: what names a run (docs/results.md). A run id is ``<setting_id>-<inputs hash>``:
the setting is what the config asks for (:func:`setting_id`, computed from the config alone, as
reports do without models or data), the inputs are what the run read (the model's identity and a
fingerprint of the task's samples), so the same command on another model file or on changed data
is another run, never "already finished". Also the renamed options and record keys older records
carry (:func:`upgrade_record`).
"""

from __future__ import annotations

import hashlib
import json
import re

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
        What the run read (``runners.output.record.run_inputs``: ``model`` identity, ``data``
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
