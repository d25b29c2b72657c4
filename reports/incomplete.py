"""The runs a report leaves out because they have not finished: a run split over shards whose shards
have not all finished (status ``incomplete``, :func:`runners.results.sharded.incomplete`, whose ``error``
names the missing and failed shards). No report draws or ranks one, and every report names the ones
its filters would have kept, as it names runs on other inputs:

- :func:`reports.runs.records_frame` keeps the finished runs and hands on the incomplete rows that
  pass the report's filters in the frame's ``attrs`` (:func:`attach`), so they travel with the
  frame to :func:`reports.pairing.pair`, whose :class:`reports.pairing.Pairing` names them in its
  notes, caption and Markdown;
- reports that read records without a frame (``memory``, ``reports.efficiency``, the experiment
  tables) take :func:`of_rows` of the rows they would show.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from runners.results.sharded import INCOMPLETE

#: The key of a frame's ``attrs`` that holds the incomplete rows its report left out.
KEY = "incomplete"


@dataclass(frozen=True)
class Incomplete:
    """A run a report left out because its shards have not all finished."""

    run_id: str
    label: str
    why: str

    def text(self) -> str:
        """``<label> (run <id>): sharded run of N shards: shard(s) ... missing``."""
        return f"{self.label} (run {self.run_id}): {self.why}"

    def note(self) -> str:
        """One line for the console and the Markdown."""
        return f"note: left out, incomplete: {self.text()}"


def of_rows(rows: Iterable[dict]) -> list[Incomplete]:
    """The :class:`Incomplete` of the rows (``run_id``, ``label``, ``status``, ``error``) whose
    status is ``incomplete``, each once, in order."""
    found = (
        Incomplete(r["run_id"], str(r["label"]), str(r["error"])) for r in rows if r["status"] == INCOMPLETE
    )
    return list(dict.fromkeys(found))


def attach(frame: pd.DataFrame, rows: Iterable[dict]) -> pd.DataFrame:
    """``frame`` with the incomplete ones of ``rows`` in its ``attrs`` (:data:`KEY`)."""
    frame.attrs[KEY] = of_rows(rows)
    return frame


def attached(frame: pd.DataFrame) -> list[Incomplete]:
    """The incomplete runs :func:`attach` handed on with ``frame`` (none for a frame built otherwise)."""
    return list(frame.attrs.get(KEY, []))


def notes(found: Iterable[Incomplete]) -> list[str]:
    """Console lines naming ``found``, each once."""
    return [i.note() for i in dict.fromkeys(found)]


def section(found: Iterable[Incomplete]) -> list[str]:
    """Markdown lines naming ``found`` (``## Left out: incomplete runs``), or none."""
    lines = [f"- {n.removeprefix('note: ')}" for n in notes(found)]
    return ["", "## Left out: incomplete runs", "", *lines] if lines else []


def caption(found: Iterable[Incomplete]) -> str:
    """A sentence for a caption naming ``found`` (empty for none)."""
    texts = [i.text() for i in dict.fromkeys(found)]
    return f" Left out, incomplete: {'; '.join(texts)}." if texts else ""


def suffix(found: Iterable[Incomplete]) -> str:
    """The end of a report's error line when nothing finished was found: the runs left out."""
    texts = [i.text() for i in dict.fromkeys(found)]
    return f" (left out, incomplete: {'; '.join(texts)})" if texts else ""
