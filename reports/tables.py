"""Tables of the reports: the compact run list (``reports runs``), the FullKV reference row, column
groups per budget, and LaTeX that compiles (booktabs rules, ``\\multicolumn`` group headers, a
``table`` or a ``table*`` by width, scaled to the text width)."""

from __future__ import annotations

import math
import re

import pandas as pd

from reports.runs import Filters, runs_frame
from reports.style import method_name
from runners.results.store import ResultStore

DASH = "–"
#: Data columns a one-column ``table`` holds; wider tables become ``table*``.
ONE_COLUMN_MAX = 6
ERROR_WIDTH = 70


def missing(value: object) -> bool:
    """Whether a cell is empty (None, NaN, pandas NA)."""
    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def budget_text(budget: object, unit: str | None) -> str:
    """A budget for people: ``5% of prompt``, ``512 slots``, ``–`` for none (FullKV)."""
    if missing(budget):
        return DASH
    if unit == "slots":
        return f"{int(budget)} slots"
    return f"{100 * float(budget):g}% of {unit or 'prompt'}"


def runs_table(store: ResultStore, filters: Filters | None = None) -> pd.DataFrame:
    """Every stored run (any status, every run of a setting) as one compact line: time, runner,
    model, method (preset and settings), task, budget, status, error, run id; oldest first."""
    frame = runs_frame(store, filters, status=None, every=True)
    if frame.empty:
        return frame
    frame = frame.sort_values("created", na_position="first")
    error = frame["error"].map(lambda e: "" if missing(e) else _shorten(str(e)))
    return pd.DataFrame(
        {
            "time": frame["created"].map(lambda c: "" if missing(c) else str(c)[:16].replace("T", " ")),
            "runner": frame["runner"].fillna(""),
            "model": frame["model"].fillna(""),
            "method": frame["label"],
            "task": frame["task"].fillna(""),
            "budget": [budget_text(b, u) for b, u in zip(frame["budget"], frame["budget_unit"], strict=True)],
            "n": frame["n"].map(lambda n: "" if missing(n) else str(int(n))),
            "status": frame["status"],
            "error": error,
            "run": frame["run_id"],  # in full: runs of one setting on other inputs share the first part
        }
    )


def _shorten(text: str) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= ERROR_WIDTH else line[: ERROR_WIDTH - 1] + "…"


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as text cells: numbers to 2 decimals, empty cells as ``–`` (never nan or <NA>)."""

    def cell(value: object) -> str:
        if missing(value):
            return DASH
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    return frame.apply(lambda col: col.map(cell)) if len(frame) else frame.astype(object)


# ---------------------------------------------------------------- LaTeX

_SPECIAL = re.compile(r"([&%$#_{}])")


def tex(text: object) -> str:
    """LaTeX-escaped text of a cell (``&%$#_{}`` escaped, ``~^\\`` spelled out, ``–`` for empty,
    ``Δ`` as ``$\\Delta$``)."""
    if missing(text):
        return "--"
    if isinstance(text, float):
        return f"{text:.2f}"
    out = str(text).replace("\\", r"\textbackslash{}").replace("~", r"\textasciitilde{}")
    out = out.replace("^", r"\textasciicircum{}").replace("–", "--")
    return _SPECIAL.sub(r"\\\1", out).replace("Δ", r"$\Delta$")


def split_header(column: str) -> tuple[str, str]:
    """``"rouge1 @ 0.2"`` -> ``("0.2", "rouge1")``; ``"paper: rouge1 @ 0.2"`` -> ``("0.2", "rouge1
    (paper)")``; a column without ``@`` is its own group ``("", column)``."""
    if " @ " not in column:
        return "", column
    sub, group = column.rsplit(" @ ", 1)
    if sub.startswith("paper: "):
        sub = sub.removeprefix("paper: ") + " (paper)"
    return group, sub


def group_title(group: str) -> str:
    """A column group's header: budgets as percentages (``0.2`` -> ``20%``), slots as counts."""
    try:
        value = float(group)
    except ValueError:
        return group
    return f"{100 * value:g}%" if value <= 1 else f"{value:g} slots"


def latex(frame: pd.DataFrame, caption: str, label: str = "") -> str:
    """A booktabs table of ``frame``: leading key columns, then one ``\\multicolumn`` group per
    budget (:func:`split_header`), rules ``\\toprule``/``\\cmidrule``/``\\midrule``/``\\bottomrule``.

    A ``table`` when at most :data:`ONE_COLUMN_MAX` data columns, else ``table*``; the tabular is
    scaled to the width (needs ``\\usepackage{booktabs,graphicx}``)."""
    columns = list(frame.columns)
    groups = [split_header(str(c)) for c in columns]
    keys = [c for c, (g, _) in zip(columns, groups, strict=True) if g == ""]
    data = len(columns) - len(keys)
    env = "table" if data <= ONE_COLUMN_MAX else "table*"
    spec = "l" * len(keys) + "r" * data
    lines = [
        "% needs \\usepackage{booktabs,graphicx}",
        f"\\begin{{{env}}}[t]",
        "\\centering",
        f"\\caption{{{tex(caption)}}}",
        *([f"\\label{{{label}}}"] if label else []),
        "\\resizebox{\\linewidth}{!}{%",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
    ]
    spans = _spans([g for g, _ in groups])
    if any(g for g, _, _ in spans):
        head, rules = [], []
        for group, start, width in spans:
            if group == "":
                head += [""] * width
                continue
            head.append(f"\\multicolumn{{{width}}}{{c}}{{{tex(group_title(group))}}}")
            rules.append(f"\\cmidrule(lr){{{start + 1}-{start + width}}}")
        lines += [" & ".join(head) + " \\\\", " ".join(rules)]
    lines.append(" & ".join(tex(sub) for _, sub in groups) + " \\\\")
    lines.append("\\midrule")
    for row in frame.itertuples(index=False):
        lines.append(" & ".join(tex(v) for v in row) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}}", f"\\end{{{env}}}"]
    return "\n".join(lines) + "\n"


def _spans(groups: list[str]) -> list[tuple[str, int, int]]:
    """Consecutive equal groups as ``(group, first column index, width)``."""
    spans: list[tuple[str, int, int]] = []
    for i, group in enumerate(groups):
        if spans and spans[-1][0] == group:
            spans[-1] = (group, spans[-1][1], spans[-1][2] + 1)
        else:
            spans.append((group, i, 1))
    return spans


def method_cell(value: object) -> str:
    """A method key of a table row by its display name (``zsmerge_xsum_paper`` stays a preset)."""
    text = "none" if missing(value) else str(value)
    return method_name(text) if text in _registered() else text


def _registered() -> set[str]:
    from reports.style import METHODS

    return set(METHODS)


def is_number(value: object) -> bool:
    """Whether ``value`` is a finite number."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
