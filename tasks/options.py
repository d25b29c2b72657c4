"""What a task's options must be (``task.limit``, ``task.max_new_tokens``, ``task.chat_template``,
``task.query_aware``, prompt templates), checked when the task is built, before any data or model
loads; each raises ``ValueError`` with the option's name. And :func:`option`, the field whose range the
run's schema checks (``runners.setup.schema``), for the tasks' and the methods' options."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any

CHAT_TEMPLATE_CHOICES = ("auto", "none")
#: The key of a field's metadata that holds its range ``(low, high)``: ``runners.setup.schema`` checks it.
RANGE = "range"
#: The key of a field's metadata that names the model fact the method clamps it to.
CLAMP = "clamp"


def option(
    default: object = MISSING,
    *,
    low: float | str | None = None,
    high: float | str | None = None,
    clamp: str | None = None,
) -> Any:
    """A dataclass field with a range that the run's schema checks before anything loads
    (``runners.setup.schema``): ``low <= value <= high``, None for no bound; a bound may name a fact of the
    model (``"max_context"``: its context in tokens, ``"head_dim"``), checked once its config is read.
    ``clamp`` names a fact above which the method clamps the value: the run says so once."""
    return field(default=default, metadata={RANGE: (low, high), CLAMP: clamp})


def check_chat_template(value: str, choices: tuple[str, ...] = CHAT_TEMPLATE_CHOICES) -> None:
    """Validate ``task.chat_template``.

    Raises
    ------
    ValueError
        For a value outside ``choices``.
    """
    if value not in choices:
        raise ValueError(f"task.chat_template must be one of {choices}, got {value!r}")


def check_query_aware(value: object, no_split: str | None = None) -> None:
    """Validate ``task.query_aware``; ``no_split`` says why a task has no context/question split
    (then only ``true`` is allowed: the whole prompt is compressed).

    Raises
    ------
    ValueError
        If ``value`` is not a boolean, or is false for a task without a split.
    """
    if not isinstance(value, bool):
        raise ValueError(f"task.query_aware must be true or false, got {value!r}")
    if not value and no_split:
        raise ValueError(
            f"task.query_aware=false compresses the context and appends the question, but {no_split}; "
            "run it with task.query_aware=true (the whole prompt compressed)"
        )


def check_limit(limit: int | None, max_new_tokens: int) -> None:
    """Validate the common task fields.

    Raises
    ------
    ValueError
        If ``limit`` is not an integer >= 1 or null, or ``max_new_tokens`` not an integer >= 1.
    """
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise ValueError(f"task.limit must be an integer >= 1 or null, got {limit!r}")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"task.max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_template(template: str, placeholders: tuple[str, ...], key: str) -> None:
    """Validate a prompt template filled with ``str.format`` (``task.instruction``).

    Raises
    ------
    ValueError
        If the template names a placeholder outside ``placeholders`` (or a positional one), or is
        not a valid format string (a lone ``{`` or ``}``: literal braces are written ``{{``, ``}}``).
    """
    try:
        template.format(**dict.fromkeys(placeholders, ""))
    except (KeyError, IndexError, ValueError) as err:
        allowed = ", ".join(f"{{{p}}}" for p in placeholders)
        reason = f"unknown placeholder {{{err.args[0]}}}" if isinstance(err, KeyError) else str(err)
        raise ValueError(
            f"{key} {template!r}: {reason}; it may use {allowed} (literal braces are written {{{{ and }}}})"
        ) from None
