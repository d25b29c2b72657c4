"""Where evaluation data comes from: a local data directory first, the Hugging Face hub otherwise.

The data directory is ``task.data_dir`` in the config, which defaults to ``$KVBENCH_DATA_DIR``
(``.ci/run`` points it at ``../shared/data``). Files are read in place, never copied.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from itertools import islice
from pathlib import Path

from tasks.errors import KVBenchError
from tasks.fields import Schema, check_row


def read_jsonl(path: Path, limit: int | None = None, schema: Schema | None = None) -> list[dict]:
    """The first ``limit`` rows (all if None) of a JSON-lines file, each an object that
    ``schema`` accepts (``tasks.fields.check_row``: the fields a loader reads and their kinds).

    Raises
    ------
    KVBenchError
        ``<file>:<line>: <what>`` for a line that is not UTF-8 or not a JSON object, or a row that
        lacks a field or holds one of another kind (``field 'document' must be a non-empty string,
        got null``).
    """
    rows = []
    with path.open("rb") as fh:
        numbered = ((n, line) for n, line in enumerate(fh, start=1) if line.strip())
        for n, raw in islice(numbered, limit):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise KVBenchError(
                    f"{path}:{n}: not valid UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1})"
                ) from err
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise KVBenchError(f"{path}:{n}: invalid JSON ({err.msg} at column {err.colno})") from err
            rows.append(check_row(row, schema, f"{path}:{n}"))
    return rows


def load_rows(
    data_dir: str | None,
    relative_path: str,
    hub_id: str | None,
    split: str,
    limit: int | None,
    hub_config: str | None = None,
    schema: Schema | None = None,
    **hub_kwargs,
) -> tuple[list[dict], str]:
    """Rows of a benchmark: ``<data_dir>/<relative_path>`` if it exists, else the hub dataset.

    Parameters
    ----------
    data_dir : str | None
        Local data directory (None: go to the hub directly).
    relative_path : str
        JSON-lines file inside ``data_dir``.
    hub_id, split, hub_config : str
        ``datasets.load_dataset(hub_id, hub_config, split=split, **hub_kwargs)`` fallback; a
        ``hub_id`` of None means the data exists only as a local file.
    limit : int | None
        Rows to keep (first N, in file order).
    schema : Schema | None
        The fields every row must have and their kinds (``tasks.fields``), checked with the file
        and line (or hub row) of the first row that fails.

    Returns
    -------
    tuple[list[dict], str]
        The rows and a description of where they came from (recorded in the result).

    Raises
    ------
    KVBenchError
        If neither the local file nor the hub dataset can be read, or a row fails ``schema``.
    """
    if data_dir:
        path = Path(data_dir).expanduser() / relative_path
        if path.is_file():
            return read_jsonl(path, limit, schema), str(path.resolve())
    if hub_id is None:
        where = Path(data_dir or "<data_dir unset>") / relative_path
        raise KVBenchError(f"missing data: {where} not found (no hub equivalent; set KVBENCH_DATA_DIR)")
    try:
        import datasets

        ds = datasets.load_dataset(hub_id, hub_config, split=split, **hub_kwargs)
    except Exception as err:  # any hub/network failure means the same thing to the user
        where = f"{Path(data_dir) / relative_path} not found and " if data_dir else "no data_dir set and "
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise KVBenchError(f"missing data: {where}hub dataset {hub_id} unavailable ({reason})") from err
    rows = ds.select(range(min(limit, len(ds)))) if limit is not None else ds
    where = f"hf://{hub_id}/{split}"
    return [check_row(dict(r), schema, f"{where} row {n}") for n, r in enumerate(rows, start=1)], where


def samples_fingerprint(samples: list) -> dict:
    """The fingerprint of the data a run evaluates: SHA-256 over the canonical JSON of every
    sample (``tasks.base.Sample``: id, prompt, references, caps, stop strings, meta), in order.

    It covers exactly what reaches the model and the scorer, wherever it came from (a local file,
    the hub, a generator): a fixed row changes it, a row beyond ``limit`` does not.

    Returns
    -------
    dict
        ``samples`` (count) and ``sha256`` (64 hex digits).
    """
    digest = hashlib.sha256()
    for sample in samples:
        row = dataclasses.asdict(sample) if dataclasses.is_dataclass(sample) else sample
        digest.update(json.dumps(row, sort_keys=True, default=str, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return {"samples": len(samples), "sha256": digest.hexdigest()}
