"""XSum extreme summarisation (Narayan et al. 2018), ROUGE-1/2/L F1 x 100 with stemming.

Two prompt protocols: ``chat`` (the article in an instruction through the model's chat template)
and the HELM k-shot format of the H2O/LESS/ZSMerge XSum experiments (``helm_0shot``,
``helm_5shot``: raw prompt without BOS, generation cut at the first "###"; docs/methods.md, "XSum").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rouge_score import rouge_scorer

from tasks.base import Sample, Task
from tasks.data import load_rows
from tasks.options import check_template, option

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
HELM_STOP = "###"


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


def cut_at_stop(text: str, stop: str = HELM_STOP) -> str:
    """The text before the first ``stop`` (all of it when absent; ZeroMerge's ``text[:find]`` would
    drop the last character then, a quirk not reproduced)."""
    idx = text.find(stop)
    return text if idx == -1 else text[:idx]


@dataclass
class Summarization(Task):
    """Shared body of the news-summarisation tasks (XSum, CNN/DailyMail).

    Parameters
    ----------
    data_dir : str | None
        Local data directory; otherwise the hub dataset is used.
    limit : int | None
        First N articles.
    max_new_tokens : int
        Generation length cap (tokens).
    instruction : str
        Chat prompt; ``{document}`` is replaced by the article.
    protocol_name : str
        ``chat`` or a HELM k-shot file (XSum only).
    chat_template : str
        ``auto`` (the chat protocol uses the tokenizer's template) or ``none`` (its text raw).
    query_aware : bool
        Only true: the prompt has no context/question split (the article is the input).
    """

    name: ClassVar[str] = "summarization"
    #: (relative local file, hub id, hub config, document field, summary field, id field)
    files: ClassVar[dict[str, tuple[str, str | None, str | None, str, str, str | None]]] = {}
    data_dir: str | None = None
    limit: int | None = option(20, low=1)
    max_new_tokens: int = option(64, low=1)
    instruction: str = "Summarize the following article in one sentence.\n\n{document}"
    protocol_name: str = "chat"
    chat_template: str = "auto"
    query_aware: bool = True
    source: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.check_fields(f"{self.name} has no context/question split (its input is an article)")
        check_template(self.instruction, ("document",), "task.instruction")
        if self.protocol_name not in self.files:
            raise ValueError(
                f"task.protocol_name must be one of {sorted(self.files)}, got {self.protocol_name!r}"
            )
        self.add_special_tokens = self.protocol_name == "chat"

    def load(self, tokenizer=None) -> list[Sample]:
        """The first ``limit`` articles of the protocol's file (or hub split).

        Raises
        ------
        tasks.errors.KVBenchError
            For missing data, or a row whose article or summary is not a non-empty string (or whose
            id is neither a string nor an integer), named by file and line.
        """
        path, hub_id, hub_config, doc_key, sum_key, id_key = self.files[self.protocol_name]
        schema = {doc_key: "text", sum_key: "text"} | ({id_key: "id"} if id_key else {})
        rows, self.source = load_rows(self.data_dir, path, hub_id, "test", self.limit, hub_config, schema)
        samples = []
        for i, row in enumerate(rows):
            sid = str(row[id_key]) if id_key else f"{self.protocol_name}-{i}"
            if self.protocol_name == "chat":
                messages = [{"role": "user", "content": self.instruction.format(document=row[doc_key])}]
                samples.append(Sample(id=sid, references=[row[sum_key]], prompt_messages=messages))
            else:
                samples.append(Sample(id=sid, references=[row[sum_key]], prompt_text=row[doc_key]))
        return samples

    def protocol(self) -> dict:
        """Prompt protocol, template use and stop string."""
        chat = self.protocol_name == "chat" and self.chat_template != "none"
        return super().protocol() | {
            "protocol": self.protocol_name,
            "chat_template": chat,
            "stop": None if chat else HELM_STOP,
        }

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """ROUGE-1/2/L F1 against the single reference (HELM: cut at "###" first)."""
        if self.protocol_name != "chat":
            predictions = [cut_at_stop(p).strip() for p in predictions]
        return rouge_f1(predictions, [s.references[0] for s in samples])


@dataclass
class XSum(Summarization):
    """XSum test set: one-sentence summary of a BBC article.

    Local files: ``xsum/test.jsonl`` (document, summary, id; hub ``EdinburghNLP/xsum``),
    ``xsum/helm_0shot.jsonl`` / ``helm_5shot.jsonl`` (article = full HELM prompt, summary_gt; no
    hub equivalent: the local file is required).
    """

    name: ClassVar[str] = "xsum"
    files: ClassVar[dict] = {
        "chat": ("xsum/test.jsonl", "EdinburghNLP/xsum", None, "document", "summary", "id"),
        "helm_0shot": ("xsum/helm_0shot.jsonl", None, None, "article", "summary_gt", None),
        "helm_5shot": ("xsum/helm_5shot.jsonl", None, None, "article", "summary_gt", None),
    }
