"""GSM-Infinite (Zhou et al. 2025): long-context grade-school math, under ZSMerge's protocol
(``exam/gsminfinite``; docs/methods.md, "GSM-Infinite"). Accuracy in %.

- realistic ``medium`` / ``hard``: rows from ``<data_dir>/gsm_infinite/<length>/<subset>/<op>/*.jsonl``
  (the official generator's output) or the hub (``InfiniAILab/gsm_infinite_<subset>_<length>``,
  split ``ops_<op>``); per op at most ``per_op_limit`` rows, sampled 40% crazy_zootopia
  normalforward, 40% crazy_zootopia forwardreverse, 5% each of movie_festival_awards /
  teachers_in_school x both modes (each share floored, so 4 + 4 at the default 10); the prompt is
  the row's ``messages`` through the chat template (rows without ``messages`` get one user
  message: problem, question and an answer-format instruction); scored by the integer answer.
- ``symbolic``: generated offline at a chosen op count and prompt length, scored by recall of the
  ground-truth variable names.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tasks.base import Sample, Task
from tasks.data import load_rows, read_jsonl
from tasks.errors import KVBenchError
from tasks.generators import gsm_symbolic
from tasks.metrics.gsm_metrics import realistic_correct, symbolic_recall
from tasks.options import option

#: ZSMerge's ``filter_config`` for the realistic subsets: (template, mode, share).
ZSMERGE_SAMPLING: tuple[tuple[str, str, float], ...] = (
    ("crazy_zootopia", "normalforward", 0.4),
    ("crazy_zootopia", "forwardreverse", 0.4),
    ("movie_festival_awards", "normalforward", 0.05),
    ("movie_festival_awards", "forwardreverse", 0.05),
    ("teachers_in_school", "normalforward", 0.05),
    ("teachers_in_school", "forwardreverse", 0.05),
)
REALISTIC_INSTRUCTION = (
    "{problem}\n\n{question}\n\nSolve the problem step by step, then give the final answer on the last "
    'line as "Answer: <number>."'
)
SYMBOLIC_INSTRUCTION = (
    "{problem}\n\n{question}\n\nWork out the value of every variable you need, then list the "
    "variables that are equal to the value."
)

#: The fields of a realistic row (``tasks.fields``): the id's parts, the solution the answer is read
#: from, and the prompt: the row's chat ``messages``, else its problem and question.
ROW_KEYS = {"op": "id", "id": "id", "template": "string", "mode": "string", "solution": "text"}


def row_schema(row: dict) -> dict[str, str]:
    """What a realistic row must hold (``tasks.fields.Schema``)."""
    prompt = {"messages": "messages"} if row.get("messages") else {"problem": "text", "question": "text"}
    return ROW_KEYS | prompt


#: Why ``query_aware=false`` is refused (``tasks.base.Task.check_fields``).
NO_SPLIT = "gsm_infinite marks no context/question split (hub rows are whole chat messages)"


def zsmerge_sample(rows: list[dict], per_op_limit: int) -> list[dict]:
    """ZSMerge's per-op sampling: for each (template, mode, share), the first
    ``int(min(per_op_limit, len(rows)) * share)`` matching rows, in that order."""
    total = min(per_op_limit, len(rows))
    picked: list[dict] = []
    for template, mode, share in ZSMERGE_SAMPLING:
        matching = [r for r in rows if r.get("template") == template and r.get("mode") == mode]
        picked += matching[: int(total * share)]
    return picked


@dataclass
class GSMInfinite(Task):
    """GSM-Infinite realistic (medium/hard) or symbolic.

    Parameters
    ----------
    subset : str
        ``medium``, ``hard`` or ``symbolic``.
    length : str
        Context-length label of the realistic data (``8k``, ``16k``, ``32k`` ...).
    ops : list[int]
        Operation counts to take (realistic: splits; symbolic: generated op counts).
    per_op_limit : int
        Rows per op before sampling (ZSMerge ``limit`` 10).
    sampling : str
        ``zsmerge`` (per template/mode shares) or ``first`` (first ``per_op_limit`` rows).
    limit : int | None
        Total rows at most, after sampling (first N).
    symbolic_tokens : int
        Prompt length (tokens) of generated symbolic problems.
    symbolic_per_op : int
        Generated problems per op (seeds ``seed`` ...).
    query_aware : bool
        Only true: no context/question split is marked (hub rows are whole chat messages).
    """

    name: ClassVar[str] = "gsm_infinite"
    data_dir: str | None = None
    subset: str = "hard"
    length: str = "8k"
    ops: list[int] = field(default_factory=lambda: [14, 15])
    per_op_limit: int = 10
    sampling: str = "zsmerge"
    limit: int | None = option(None, low=1)
    symbolic_tokens: int = 2000
    symbolic_per_op: int = 5
    seed: int = 0
    max_new_tokens: int = option(512, low=1)
    chat_template: str = "auto"
    query_aware: bool = True
    source: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.check_fields(NO_SPLIT)
        if self.subset not in ("medium", "hard", "symbolic"):
            raise ValueError(f"task.subset must be medium, hard or symbolic, got {self.subset!r}")
        if self.sampling not in ("zsmerge", "first"):
            raise ValueError(f"task.sampling must be zsmerge or first, got {self.sampling!r}")
        if not self.ops or any(op < 1 for op in self.ops):
            raise ValueError(f"task.ops must be positive op counts, got {self.ops}")

    def _realistic_rows(self, op: int) -> tuple[list[dict], str]:
        folder = Path(self.data_dir or "").expanduser() / "gsm_infinite" / self.length / self.subset / str(op)
        files = (
            sorted(folder.glob("*.jsonl"), key=lambda p: int(p.stem.rsplit("_", 1)[-1]))
            if self.data_dir
            else []
        )
        if files:
            return [row for path in files for row in read_jsonl(path, schema=row_schema)], str(folder)
        hub_id = f"InfiniAILab/gsm_infinite_{self.subset}_{self.length}"
        return load_rows(None, "", hub_id, f"ops_{op}", None, schema=row_schema)

    def _symbolic(self, tokenizer) -> list[Sample]:
        if tokenizer is None:
            raise KVBenchError("generated GSM-Infinite symbolic problems need the model's tokenizer")

        def count(problem: str, question: str) -> int:
            text = SYMBOLIC_INSTRUCTION.format(problem=problem, question=question)
            probe = Sample(id="", references=[], prompt_messages=[{"role": "user", "content": text}])
            return self.encode(tokenizer, probe).shape[1]

        samples = []
        for op in self.ops:
            for k in range(self.symbolic_per_op):
                try:
                    prob = gsm_symbolic.generate(op, self.symbolic_tokens, self.seed + k, count)
                except ValueError as err:  # a length shorter than the problem's tree alone
                    raise KVBenchError(f"task.symbolic_tokens={self.symbolic_tokens}: {err}") from err
                text = SYMBOLIC_INSTRUCTION.format(problem=prob.problem, question=prob.question)
                samples.append(
                    Sample(
                        id=f"symbolic-op{op}-seed{self.seed + k}",
                        references=[", ".join(prob.answer)],
                        prompt_messages=[{"role": "user", "content": text}],
                        meta={"op": op, "answer_list": prob.answer, "n_vars": prob.n_vars},
                    )
                )
        self.source = (
            f"generated (GSM-Infinite symbolic recipe, {self.symbolic_tokens} tokens, seed {self.seed})"
        )
        return samples

    def load(self, tokenizer=None) -> list[Sample]:
        """Sampled realistic rows of every op, or generated symbolic problems; first ``limit``."""
        if self.subset == "symbolic":
            return self._symbolic(tokenizer)[: self.limit]
        samples, sources = [], []
        for op in self.ops:
            rows, where = self._realistic_rows(op)
            sources.append(where)
            picked = (
                zsmerge_sample(rows, self.per_op_limit)
                if self.sampling == "zsmerge"
                else rows[: self.per_op_limit]
            )
            for row in picked:
                messages = row.get("messages") or [
                    {
                        "role": "user",
                        "content": REALISTIC_INSTRUCTION.format(
                            problem=row["problem"], question=row["question"]
                        ),
                    }
                ]
                samples.append(
                    Sample(
                        id=f"op{row['op']}-{row['id']}-{row['template']}-{row['mode']}",
                        references=[row["solution"]],
                        prompt_messages=list(messages),
                        meta={"op": row["op"], "template": row["template"], "mode": row["mode"]},
                    )
                )
        self.source = "; ".join(sources)
        return samples[: self.limit]

    def protocol(self) -> dict:
        """Subset, length, sampling and prompt facts."""
        return super().protocol() | {
            "benchmark": f"GSM-Infinite {self.subset} {self.length} (ZSMerge scorer)",
            "chat_template": self.chat_template != "none",
            "sampling": self.sampling,
            "per_op_limit": self.per_op_limit,
            "prompt": "row messages, else "
            + (SYMBOLIC_INSTRUCTION if self.subset == "symbolic" else REALISTIC_INSTRUCTION),
        }

    def score(self, predictions: list[str], samples: list[Sample]) -> tuple[dict[str, float], list[dict]]:
        """Accuracy % overall and per op (symbolic: mean recall %)."""
        per_sample, by_op = [], {}
        for pred, sample in zip(predictions, samples, strict=True):
            if self.subset == "symbolic":
                value = symbolic_recall(pred, sample.meta["answer_list"])
            else:
                value = realistic_correct(pred, sample.references[0])
            per_sample.append({"score": 100.0 * value, "op": sample.meta["op"]})
            by_op.setdefault(sample.meta["op"], []).append(value)
        metrics = {"accuracy": 100 * statistics.fmean(v for vals in by_op.values() for v in vals)}
        metrics |= {f"accuracy/op{op}": 100 * statistics.fmean(v) for op, v in sorted(by_op.items())}
        return metrics, per_sample
