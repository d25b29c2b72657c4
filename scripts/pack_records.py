"""Pack the finished runs of a shard of a grid into an archive, to publish a leaderboard's records.

``python scripts/pack_records.py STORE DEST GRID NUM_SHARDS I [I ...]``: for each shard I, the ``ok``
runs of the store whose config has ``runner.num_shards=NUM_SHARDS`` and ``runner.shard_index=I``
and that no archive in DEST holds yet go into ``DEST/<GRID>-shard-<I>[-<k>].tar.xz`` as
``runs/<run_id>/record.json`` and ``predictions.jsonl`` (leaderboard/README.md). An existing archive
is never rewritten.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path


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
    done = packed(dest)
    for i in shards:
        runs = []
        for path in sorted((store / "runs").glob("*/record.json")):
            record = json.loads(path.read_text())
            runner = record.get("config", {}).get("runner", {})
            mine = runner.get("num_shards") == num_shards and runner.get("shard_index") == i
            if mine and record.get("status") == "ok" and record["run_id"] not in done:
                runs.append(path.parent)
        if not runs:
            print(f"shard {i}: nothing new")
            continue
        k, out = 0, dest / f"{grid}-shard-{i:02d}.tar.xz"
        while out.exists():
            k, out = k + 1, dest / f"{grid}-shard-{i:02d}-{k + 1}.tar.xz"
        with tarfile.open(out, "w:xz") as tar:
            for run in runs:
                for name in ("record.json", "predictions.jsonl"):
                    tar.add(run / name, arcname=f"runs/{run.name}/{name}")
        print(f"{out}: {len(runs)} runs, {out.stat().st_size} bytes")


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit("usage: python scripts/pack_records.py STORE DEST GRID NUM_SHARDS I [I ...]")
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), [int(i) for i in sys.argv[5:]])
