"""A process-wide named choice set once from the config: the decode-attention backend
(``kernels=auto|torch|triton``) and how decode steps run (``backend=eager|compiled``)."""

from __future__ import annotations


class Switch:
    """One config key's current value among fixed ``choices``.

    Parameters
    ----------
    key : str
        The config key (named in errors).
    choices : tuple[str, ...]
        Allowed values.
    default : str
        The value before any :meth:`set`.
    """

    def __init__(self, key: str, choices: tuple[str, ...], default: str) -> None:
        self.key, self.choices, self.value = key, choices, default

    def set(self, name: str) -> None:
        """Choose ``name``.

        Raises
        ------
        ValueError
            For a name not in ``choices``.
        """
        if name not in self.choices:
            raise ValueError(f"{self.key} must be one of {self.choices}, got {name!r}")
        self.value = name

    def get(self) -> str:
        """The current value."""
        return self.value
