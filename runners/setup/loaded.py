"""A task's samples and prompt ids, kept for the rest of the process once loaded.

The jobs of a local multirun (``python run.py -m runner.num_shards=13 'runner.shard_index=range(13)'``,
or ``-m method=a,b,c``) run one after the other in one process, and each builds the same samples: every
shard needs all of them (a sharded run is identified by every sample). RULER generates its haystacks
with a tokenizer-sized search, minutes for 390 samples on a CPU. The last load is kept and given again
to a task in the same state with the same tokenizer, as copies; the attributes its ``load`` set or
changed (``source``, the tokenizer's name, RULER's inputs ...) are given to the new task too, so its
record's protocol is the same. A data file rewritten between two jobs of one process is not read again.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable

import torch

#: The last load: (key, samples, prompt ids, the attributes ``load`` set on its task).
_LAST: list[tuple[str, list, list[torch.Tensor], dict]] = []


def load_key(task: object, tokenizer, state: dict[str, str | None]) -> str | None:
    """SHA-256 over the task's class and ``state`` (:func:`attribute_digests` before loading), the
    tokenizer (its name, serialized vocabulary and rules, chat template, special tokens and the settings
    outside its rules that change ``encode`` or ``decode``) and ``KVBENCH_DATA_DIR``; None (nothing
    kept) when an attribute or the tokenizer has no stable text form (an object address)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    settings = (
        "name_or_path",
        "chat_template",
        "special_tokens_map",
        "split_special_tokens",
        "clean_up_tokenization_spaces",
    )
    parts = [
        f"{type(task).__module__}.{type(task).__qualname__}",
        *(f"{name}={digest}" for name, digest in sorted(state.items())),
        type(tokenizer).__qualname__,
        *(repr(getattr(tokenizer, name, None)) for name in settings),
        os.environ.get("KVBENCH_DATA_DIR", ""),
    ]
    if backend is None or None in state.values() or any(" at 0x" in p for p in parts):
        return None
    digest = hashlib.sha256("\n".join(parts).encode())
    digest.update(backend.to_str().encode())
    return digest.hexdigest()


def load_once(
    task: object, tokenizer, load: Callable[[], tuple[list, list[torch.Tensor]]]
) -> tuple[list, list]:
    """``load()``'s samples and prompt ids ``[1, prompt]`` for ``task``, or copies of the last ones when
    the task and tokenizer are in the same state (:func:`load_key`), the attributes the last load set or
    changed (their text form differs after it) copied onto ``task``; raises as ``load`` does."""
    before = attribute_digests(task)
    key = load_key(task, tokenizer, before)
    if key is None or not _LAST or _LAST[0][0] != key:
        samples, prompts = load()
        after = attribute_digests(task)
        changed = {k: v for k, v in vars(task).items() if before.get(k) != after[k]}  # set or mutated
        _LAST[:] = [] if key is None else [(key, samples, prompts, copy.deepcopy(changed))]
    else:
        _, samples, prompts, changed = _LAST[0]
        vars(task).update(copy.deepcopy(changed))
    return copy.deepcopy(samples), [p.clone() for p in prompts]


def attribute_digests(task: object) -> dict[str, str | None]:
    """Per attribute of ``task``, the SHA-256 of its text form (an attribute may hold a whole local
    dataset); None where that text has an object address (no stable form)."""
    out = {}
    for name, value in vars(task).items():
        text = repr(value)
        out[name] = None if " at 0x" in text else hashlib.sha256(text.encode()).hexdigest()
    return out
