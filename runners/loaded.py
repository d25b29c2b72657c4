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


def load_key(task: object, tokenizer) -> str | None:
    """SHA-256 over the task's class and attributes before loading, the tokenizer (its name, serialized
    vocabulary and rules, chat template, special tokens and the settings outside its rules that change
    ``encode`` or ``decode``) and ``KVBENCH_DATA_DIR``; None (nothing kept) when an attribute or the
    tokenizer has no stable text form (an object address)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    settings = ("name_or_path", "chat_template", "special_tokens_map", "split_special_tokens")
    settings += ("clean_up_tokenization_spaces",)
    parts = [
        f"{type(task).__module__}.{type(task).__qualname__}",
        repr(sorted(vars(task).items())),
        type(tokenizer).__qualname__,
        *(repr(getattr(tokenizer, name, None)) for name in settings),
        os.environ.get("KVBENCH_DATA_DIR", ""),
    ]
    if any(" at 0x" in p for p in parts) or backend is None:
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
    key = load_key(task, tokenizer)
    if key is None or not _LAST or _LAST[0][0] != key:
        before = {k: _digest(v) for k, v in vars(task).items()}
        samples, prompts = load()
        changed = {k: v for k, v in vars(task).items() if before.get(k) != _digest(v)}  # set or mutated
        _LAST[:] = [] if key is None else [(key, samples, prompts, copy.deepcopy(changed))]
    else:
        _, samples, prompts, changed = _LAST[0]
        vars(task).update(copy.deepcopy(changed))
    return copy.deepcopy(samples), [p.clone() for p in prompts]


def _digest(value: object) -> str:
    """SHA-256 of ``value``'s text form (a task attribute may hold a whole local dataset)."""
    return hashlib.sha256(repr(value).encode()).hexdigest()
