"""Read back an offline W&B run: the records of its ``run-<id>.wandb`` transaction log.

wandb (0.2x-0.3x) has no public reader for offline runs (``wandb.Api`` reads the server only), so
the log is parsed here: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB-log
blocks of 32 KiB whose chunks (crc32 seeded by the chunk type, length, type: full / first / middle
/ last) carry serialised ``wandb_internal_pb2.Record`` messages (wandb's own protobuf classes).
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = struct.Struct("<IHB")  # crc32, length, chunk type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_SEED = {t: zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in (FULL, FIRST, MIDDLE, LAST)}


def _chunks(data: bytes) -> Iterator[tuple[int, bytes]]:
    ident, magic, version = struct.unpack_from("<4sHB", data)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"not a W&B transaction log (header {data[:7]!r})")
    pos = 7
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER.size:  # block trailer: zero padding
            pos += left
            continue
        crc, length, kind = HEADER.unpack_from(data, pos)
        if length == 0 and kind == 0:  # zero-filled rest of the file
            return
        payload = data[pos + HEADER.size : pos + HEADER.size + length]
        if zlib.crc32(payload, _SEED[kind]) & 0xFFFFFFFF != crc:
            raise ValueError(f"bad checksum at byte {pos}")
        yield kind, payload
        pos += HEADER.size + length


def read_records(path: str | Path) -> list[wandb_internal_pb2.Record]:
    """Every record of a ``.wandb`` file, in order.

    Raises
    ------
    ValueError
        For a file that is not a W&B transaction log or a corrupt chunk.
    """
    out, parts = [], b""
    for kind, payload in _chunks(Path(path).read_bytes()):
        parts = payload if kind in (FULL, FIRST) else parts + payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def offline_run(wandb_dir: Path, rid: str) -> tuple[Path, dict[str, list]]:
    """The offline run directory of run ``rid`` and its transaction-log records by type. wandb's
    service process may still be writing the log when ``run.finish()`` returns: the log is read
    until it holds the run's ``exit`` record (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        dirs = list((wandb_dir / "wandb").glob(f"offline-run-*-{rid}"))
        try:
            records = read_records(dirs[0] / f"run-{rid}.wandb") if len(dirs) == 1 else []
        except (OSError, ValueError):  # not there yet, or a chunk half written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    (run_dir,) = dirs
    by_type: dict[str, list] = {}
    for rec in records:
        kind = rec.WhichOneof("record_type")
        by_type.setdefault(kind, []).append(getattr(rec, kind))
    return run_dir, by_type


def history_rows(by_type: dict[str, list]) -> list[dict]:
    """Each history step as ``{"a/b": value}`` (values decoded from JSON)."""
    return [
        {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in step.item}
        for step in by_type.get("history", [])
    ]
