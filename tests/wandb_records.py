"""Read back an offline W&B run: the records of its ``run-<id>.wandb`` transaction log.

wandb (0.2x-0.3x) has no public reader for offline runs (``wandb.Api`` reads the server only), so
the log is parsed here: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB-log
blocks of 32 KiB whose chunks (crc32 seeded by the chunk type, length, type: full / first / middle
/ last) carry serialised ``wandb_internal_pb2.Record`` messages (wandb's own protobuf classes).
"""

from __future__ import annotations

import struct
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
