"""XSum extreme summarisation (Narayan et al. 2018), ROUGE-1/2/L F1 x 100 with stemming."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rouge_score import rouge_scorer

from tasks.base import Sample, Task
from tasks.data import load_rows

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_f1(predictions: list[str], references: list[str]) -> tuple[dict[str, float], list[dict]]:
    """Mean ROUGE-1/2/L F1 (x 100, Porter stemming) with the ``rouge-score`` package.

    Returns
    -------
    tuple[dict[str, float], list[dict]]
        Means over samples and the per-sample scores.
    """
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    per_sample = []
    for pred, ref in zip(predictions, references, strict=True):
        scores = scorer.score(ref, pred)
        per_sample.append({k: 100.0 * scores[k].fmeasure for k in ROUGE_TYPES})
    n = max(1, len(per_sample))
    return {k: sum(s[k] for s in per_sample) / n for k in ROUGE_TYPES}, per_sample


@dataclass
class XSum(Task):
    """XSum test set: one-sentence summary of a BBC article, prompted through the chat template.

    Parameters
    ----------
    data_dir : str | None
        Local data directory holding ``xsum/test.jsonl`` (fields document, summary, id);
        otherwise the hub dataset ``EdinburghNLP/xsum`` (test split) is used.
    limit : int | None
        First N articles (20 by default).
    max_new_tokens : int
        Generation length cap (64).
    instruction : str
        Prompt; ``{document}`` is replaced by the article.
    """

    name: ClassVar[str] = "xsum"
    data_dir: str | None = None
    limit: int | None = 20
    max_new_tokens: int = 64
    instruction: str = "Summarize the following article in one sentence.\n\n{document}"
    source: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"task.limit must be >= 1 or null, got {self.limit}")
        if self.max_new_tokens < 1:
            raise ValueError(f"task.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def load(self) -> list[Sample]:
        """The first ``limit`` test articles."""
        rows, self.source = load_rows(
            self.data_dir, "xsum/test.jsonl", "EdinburghNLP/xsum", "test", self.limit
        )
        return [
            Sample(
                id=str(row["id"]),
                prompt_messages=[
                    {"role": "user", "content": self.instruction.format(document=row["document"])}
                ],
                references=[row["summary"]],
            )
            for row in rows
        ]

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """ROUGE-1/2/L F1 against the single reference summary."""
        return rouge_f1(predictions, [s.references[0] for s in samples])
