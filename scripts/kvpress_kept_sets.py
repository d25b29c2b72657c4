"""Kept sets of KVBench's methods against kvpress's presses, on one tiny random Llama and the same prompts.

kvpress pins its own transformers, so the script runs itself a second time under kvpress's interpreter
(``--kvpress-python``, a venv with ``pip install kvpress``): that side (``kvpress_kept_theirs.py``) saves
the weights, the prompts and, per press, the positions each (layer, KV head) keeps after the prefill
(kvpress gathers the kept rows, found again by their keys and values, by values alone for KeyRerotation;
``DMSPress``, ``AdaKVPress`` and unstructured ``KVComposePress`` mask, their ``masked_key_indices`` are
read). KVBench's side (``kvpress_kept_ours.py``) prefills the same weights and prompts with the matching
method and prints, per method, how many (prompt, layer, head) sets are identical and their Jaccard index;
for ``key_rerotation`` also the largest difference between kvpress's re-rotated keys (turned forward to
KVBench's positions) and ours, for ``kvcompose`` between kvpress's stored composite tokens (keys and
values, per head in position order) and ours. The cases (a press and a preset each) are in
``kvpress_kept_cases.py``; the models, prompts and re-run in ``kvpress_driver.py``.

``--real``: the embedded SmolLM2-135M-Instruct instead (its weights exported once as safetensors for
kvpress's side) on real prompts, every layer and KV head: two XSum articles (the first, and the longest
of the first 20) and RULER's niah_single_2 at 4K and vt at 2K (the compressed piece of sample 0, as
kvpress's pipeline cuts it; ``KVBENCH_DATA_DIR``).

Usage::

    python scripts/kvpress_kept_sets.py --kvpress-python /path/to/kvpress-venv/bin/python
    python scripts/kvpress_kept_sets.py --kvpress-python /path/to/kvpress-venv/bin/python --real
    KVPRESS_CASES=tova,knorm python scripts/kvpress_kept_sets.py --kvpress-python ...   # some cases only
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kvpress_driver as driver
from kvpress_kept_cases import kvbench_cases
from kvpress_kept_ours import kvbench_side
from kvpress_kept_theirs import kvpress_side

if __name__ == "__main__":
    driver.main(__doc__, __file__, kvpress_side, kvbench_side, check=kvbench_cases)
