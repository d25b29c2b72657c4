"""``python -m reports [results_dir]``: print every stored run as one table."""

from __future__ import annotations

import sys

import pandas as pd

from runners.loggers import flat_summary
from runners.results import ResultStore


def main(argv: list[str]) -> int:
    """Print the result store's runs (identity, status, metrics, efficiency) as a table."""
    store = ResultStore(argv[0] if argv else "results")
    records = store.records()
    if not records:
        print(f"no records under {store.root}/runs", file=sys.stderr)
        return 1
    frame = pd.DataFrame([flat_summary(r) for r in records])
    cols = [c for c in frame.columns if not c.startswith("method.") and c not in ("created",)]
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(frame[cols].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
