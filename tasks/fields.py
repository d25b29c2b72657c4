"""What a benchmark row's fields must be, checked once for every loader before any model loads.

A schema maps a field name to its kind (:data:`KINDS`): ``{"document": "text", "summary": "text",
"id": "id"}``. Every field a schema names must be present and of its kind; a row that fails is one
:class:`tasks.errors.KVBenchError` naming where the row is (``<file>:<line>``, ``hf://<id>/<split>
row <n>`` or a file and a JSON path) and the field, so missing text is never scored as the word
"None". A schema may also be a function of the row (GSM-Infinite rows hold either chat messages or
a problem and a question).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tasks.errors import KVBenchError

Schema = Mapping[str, str] | Callable[[dict], Mapping[str, str]]


def _text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _message(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str) and _text(value.get("content"))


def _list_of(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and bool(value) and all(test(x) for x in value)


#: kind -> (test, what the error line says the field must be).
KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "text": (_text, "a non-empty string"),
    "string": (lambda v: isinstance(v, str), "a string (it may be empty)"),
    "texts": (_list_of(lambda v: isinstance(v, str)), "a non-empty list of strings"),
    "id": (lambda v: isinstance(v, str) or (_number(v) and float(v).is_integer()), "a string or an integer"),
    # InfiniteBench's answer: a string, or a list of strings (numbers in the math tasks)
    "label": (
        lambda v: _text(v) or _list_of(lambda x: isinstance(x, str) or _number(x))(v),
        "a non-empty string or a non-empty list of strings or numbers",
    ),
    "messages": (_list_of(_message), 'a non-empty list of {"role": ..., "content": <non-empty string>}'),
}


def described(value: object) -> str:
    """``value``'s JSON type in words, for an error line (``null``, ``an empty string``,
    ``a list holding a number`` ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if _number(value):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string" if value.strip() else "an empty string"
    if isinstance(value, list):
        if not value:
            return "an empty list"
        odd = [x for x in value if not isinstance(x, str)]
        return f"a list holding {described(odd[0])}" if odd else "a list of strings"
    return "an object" if isinstance(value, dict) else type(value).__name__


def check_value(value: object, kind: str, where: str) -> None:
    """Check one value against a kind of :data:`KINDS`.

    Parameters
    ----------
    value : object
        The parsed JSON value.
    kind : str
        A key of :data:`KINDS`.
    where : str
        Where the value is, as the error line names it (``<file>:<line>: field 'document'``).

    Raises
    ------
    KVBenchError
        ``<where> must be <what>, got <described value>``.
    """
    test, what = KINDS[kind]
    if not test(value):
        raise KVBenchError(f"{where} must be {what}, got {described(value)}")


def check_row(row: object, schema: Schema | None, where: str) -> dict:
    """Check one row against ``schema`` (field -> kind, or a function of the row giving it).

    Parameters
    ----------
    row : object
        A parsed row (a JSON object is expected).
    schema : Schema | None
        What the loader reads from the row; None checks only that the row is an object.
    where : str
        Where the row is: ``<file>:<line>`` or ``hf://<dataset>/<split> row <n>``.

    Returns
    -------
    dict
        The row.

    Raises
    ------
    KVBenchError
        If the row is not an object, lacks a field the schema names, or holds a field of another
        kind (:func:`check_value`).
    """
    if not isinstance(row, dict):
        raise KVBenchError(f"{where}: expected a JSON object, got {described(row)}")
    fields = (schema(row) if callable(schema) else schema) or {}
    if missing := [f for f in fields if f not in row]:
        raise KVBenchError(f"{where}: missing field(s) {missing}")
    for field, kind in fields.items():
        check_value(row[field], kind, f"{where}: field {field!r}")
    return row
