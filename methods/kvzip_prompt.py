"""KVzip's reconstruction prompt (Kim et al. 2025, Sec. 3.2; kvpress ``KVzipPress.prepare``): the
instructions that ask the model to repeat its context, and the chat template around them, as token
ids of the model's tokenizer (``methods.kvzip``)."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.chat import user_turn

#: The reconstruction instructions (kvpress's ``KVzipPress.prepare``; the official code's, without
#: its trailing space after "with").
REPEAT = "\n\nRepeat the previous context exactly."
RESUME = "\n\nRepeat the part of the previous context exactly, starting with"


@dataclass(frozen=True)
class ReconstructionPrompt:
    """KVzip's reconstruction prompt as token ids of the model's tokenizer.

    Attributes
    ----------
    head : tuple[int, ...]
        The chat template before the user message (system prompt, user header): a prompt that starts
        with it has it kept and not reconstructed.
    repeat, resume : tuple[int, ...]
        :data:`REPEAT` (first chunk) and :data:`RESUME` (later chunks).
    tail : tuple[int, ...]
        The template after the user message (end of turn, generation prompt); ``"\\n"`` without one.
    """

    head: tuple[int, ...]
    repeat: tuple[int, ...]
    resume: tuple[int, ...]
    tail: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer, template_kwargs: dict) -> ReconstructionPrompt:
        """The pieces as kvpress derives them: the template around a dummy message, split where
        the message is (``tasks.chat.user_turn``).

        Raises
        ------
        KVBenchError
            If the chat template rewrites the user message.
        """
        head, tail = "", "\n"
        if getattr(tokenizer, "chat_template", None) is not None:
            content = "dummy context"
            text, tail = user_turn(tokenizer, content, template_kwargs)
            head = text.split(content)[0]

        def encode(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        return cls(encode(head), encode(REPEAT), encode(RESUME), encode(tail))
