"""The task contract: rows -> prompts -> predictions -> metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass
class Sample:
    """One evaluation example.

    Attributes
    ----------
    id : str
        The dataset's id of the row.
    prompt_messages : list[dict]
        Chat messages (``role``/``content``) to render with the model's chat template.
    references : list[str]
        Gold answers (a metric takes the best match over them).
    """

    id: str
    prompt_messages: list[dict]
    references: list[str]


class Task:
    """Base class: a benchmark builds samples and scores predictions.

    Class attributes
    ----------------
    name : str
        Registry key (``task=<name>``).
    """

    name: ClassVar[str] = "base"
    max_new_tokens: int
    limit: int | None

    def load(self) -> list[Sample]:
        """Read the rows (local data dir first, hub otherwise).

        Raises
        ------
        runners.errors.KVBenchError
            If the data cannot be found.
        """
        raise NotImplementedError

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """Aggregate metrics and per-sample metric dicts for the predictions."""
        raise NotImplementedError
