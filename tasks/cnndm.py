"""CNN/DailyMail 3.0.0 summarisation (Hermann et al. 2015; See et al. 2017), ROUGE-1/2/L like XSum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tasks.options import option
from tasks.xsum import Summarization


@dataclass
class CNNDailyMail(Summarization):
    """CNN/DailyMail test set: multi-sentence highlights of a news article.

    Local file ``cnndm/test_first500.jsonl`` (id, article, highlights: the first 500 test rows in
    order); otherwise the hub dataset ``abisee/cnn_dailymail`` 3.0.0, test split.
    """

    name: ClassVar[str] = "cnndm"
    files: ClassVar[dict] = {
        "chat": ("cnndm/test_first500.jsonl", "abisee/cnn_dailymail", "3.0.0", "article", "highlights", "id"),
    }
    max_new_tokens: int = option(128, low=1)
    instruction: str = "Summarize the following news article in three sentences.\n\n{document}"
