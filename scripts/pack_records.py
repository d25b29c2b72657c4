"""Pack the finished runs of a shard of a grid into an archive, to publish a leaderboard's records.

``python scripts/pack_records.py STORE DEST GRID NUM_SHARDS I [I ...]``: for each shard I, the ``ok``
runs of the store whose config has ``runner.num_shards=NUM_SHARDS`` and ``runner.shard_index=I``
and that no archive in DEST holds yet go into ``DEST/<GRID>-shard-<I>[-<k>].tar.xz`` as
``runs/<run_id>/record.json`` and ``predictions.jsonl`` (leaderboard/README.md). An existing archive
is never rewritten.
"""

from __future__ import annotations

import itertools
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runners.results.sharded import shard_of
from runners.results.store import ResultStore


def packed(dest: Path) -> set[str]:
    """Run ids already in an archive of ``dest``."""
    ids = set()
    for archive in dest.glob("*.tar.xz"):
        with tarfile.open(archive) as tar:
            ids |= {Path(name).parent.name for name in tar.getnames() if name.endswith("record.json")}
    return ids


def main(store: Path, dest: Path, grid: str, num_shards: int, shards: list[int]) -> None:
    """Write one new archive per shard with runs to pack; print what was written."""
    dest.mkdir(parents=True, exist_ok=True)
    done, results = packed(dest), ResultStore(store)
    new: dict[int, list[str]] = {i: [] for i in shards}
    for record in results.records():  # one read of the store for every shard asked
        shard = shard_of(record.get("config") or {})
        if shard is not None and shard[0] == num_shards and shard[1] in new:
            if record.get("status") == "ok" and record["run_id"] not in done:
                new[shard[1]].append(record["run_id"])
    for i, rids in new.items():
        if not rids:
            print(f"shard {i}: nothing new")
            continue
        names = (f"{grid}-shard-{i:02d}{f'-{k}' if k else ''}.tar.xz" for k in itertools.count())
        out = next(dest / n for n in names if not (dest / n).exists())
        with tarfile.open(out, "w:xz") as tar:
            for rid in sorted(rids):
                for name in ("record.json", "predictions.jsonl"):
                    tar.add(results.run_dir(rid) / name, arcname=f"runs/{rid}/{name}")
        print(f"{out}: {len(rids)} runs, {out.stat().st_size} bytes")


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit("usage: python scripts/pack_records.py STORE DEST GRID NUM_SHARDS I [I ...]")
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), [int(i) for i in sys.argv[5:]])
