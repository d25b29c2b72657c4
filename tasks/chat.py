"""The model's chat template as tasks use it: the keyword arguments it is rendered with
(``model.chat_template_kwargs``), and a prompt built in the two pieces of kvpress's pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import jinja2
import jinja2.meta

from tasks.errors import KVBenchError

#: The template variable of thinking models (Qwen3): with it false the template writes an empty
#: thinking block after the generation prompt, so the answer starts at once.
THINKING = "enable_thinking"


def check_template_kwargs(value: object) -> None:
    """Validate ``model.chat_template_kwargs``: null or a mapping with string keys.

    Raises
    ------
    KVBenchError
        For any other value.
    """
    if value is not None and (not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value)):
        raise KVBenchError(
            f"model.chat_template_kwargs must be a dict of template variables or null, got {value!r}"
        )


def template_variables(templates: Iterable[str]) -> set[str] | str:
    """The variables the Jinja chat ``templates`` read (``jinja2.meta``); the templates' text where one
    does not parse without transformers' own tags (a key is then looked for in it)."""
    templates, env = list(templates), jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return set().union(*(jinja2.meta.find_undeclared_variables(env.parse(t)) for t in templates))
    except jinja2.TemplateSyntaxError:
        return " ".join(templates)


def template_kwargs(tokenizer, configured: Mapping | None) -> dict:
    """The keyword arguments the chat template is rendered with (lm-eval's ``chat_template_kwargs``).

    Parameters
    ----------
    tokenizer : transformers tokenizer
    configured : Mapping | None
        ``model.chat_template_kwargs``; null: ``{"enable_thinking": False}`` where the template reads
        that variable (thinking off, as kvpress's pipeline renders every prompt), else none.

    Returns
    -------
    dict
        The variables given to ``tokenizer.apply_chat_template``.

    Raises
    ------
    KVBenchError
        As :func:`check_template_kwargs`, or for a variable the template never names.
    """
    check_template_kwargs(configured)
    if configured is not None:
        template = getattr(tokenizer, "chat_template", None) or ""
        names = template_variables(template.values() if isinstance(template, Mapping) else [template])
        if unread := [key for key in configured if key not in names]:
            raise KVBenchError(
                f"model.chat_template_kwargs.{unread[0]}: the tokenizer's chat template never reads it"
            )
        return dict(configured)
    return {THINKING: False} if THINKING in (getattr(tokenizer, "chat_template", None) or "") else {}


def user_turn(tokenizer, content: str, kwargs: Mapping) -> tuple[str, str]:
    """``(head, tail)`` of one user message rendered with the generation prompt: the template's
    text up to the end of ``content`` and the text after it (end of turn, assistant header, an empty
    thinking block). kvpress's pipeline splits the same way: it renders ``content`` followed by a
    separator the content cannot hold (``"\\n" + "#" * len(content)``) and splits there, so a
    template that trims the message leaves ``content``'s end as it is.

    Raises
    ------
    KVBenchError
        If the rendered template does not hold the separator once (it rewrites the message).
    """
    separator = "\n" + "#" * len(content)
    messages = [{"role": "user", "content": content + separator}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    parts = text.split(separator)
    if len(parts) != 2:
        name = getattr(tokenizer, "name_or_path", "the model")
        raise KVBenchError(
            f"the chat template of {name} rewrites the user message; run task.chat_template=none"
        )
    return parts[0], parts[1]


def pipeline_pieces(
    tokenizer, compressed: str, question: str, prefix: str, kwargs: Mapping | None
) -> tuple[str, str, bool]:
    """``(first, second, special)``: a prompt in the two pieces kvpress's pipeline tokenizes apart
    (``KVPressTextGenerationPipeline.preprocess``), and whether the first gets the tokenizer's
    special tokens (BOS).

    With a chat template (``kwargs`` given): the template up to the end of ``compressed`` (the user
    message's text, :func:`user_turn`), then ``question`` + the template's end of turn and
    generation prompt + ``prefix`` (the answer prefix). Without (``kwargs`` None): ``compressed`` raw
    with special tokens, then ``question + prefix`` (kvpress puts a newline between the two; RULER's
    base template does not).
    """
    if kwargs is None:
        return compressed, question + prefix, True
    head, tail = user_turn(tokenizer, compressed, kwargs)
    return head, question + tail + prefix, False
