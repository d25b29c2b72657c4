"""Process-wide state set once from the config and read on the decode path: named choices
(:class:`Switch`: the decode-attention backend ``kernels=auto|torch|triton``, how decode steps run
``backend=eager|compiled``) and what actually ran (:class:`Ledger`, for the run record)."""

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


class Ledger:
    """What ran under each name since the last :meth:`clear` (one run's record)."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}

    def note(self, name: str, value: str) -> None:
        """Note that ``value`` ran under ``name``."""
        self.seen.setdefault(name, set()).add(value)

    def clear(self) -> None:
        """Forget everything noted."""
        self.seen.clear()

    def summary(self, names: tuple[str, ...]) -> dict[str, str | None]:
        """``name -> value`` for each of ``names``: several values joined by ``+`` (sorted), None
        where nothing ran."""
        return {name: "+".join(sorted(self.seen[name])) if name in self.seen else None for name in names}


BACKENDS = ("auto", "torch", "triton")
#: ``kernels=auto`` (Triton on CUDA once proven, ``kernels.proof``; PyTorch otherwise), ``torch``
#: (always the PyTorch path) or ``triton`` (always the kernel, a failed proof is an error; on CPU
#: only under ``TRITON_INTERPRET=1``).
BACKEND = Switch("kernels", BACKENDS, "auto")
#: What the decode path ran: ``uniform`` / ``ragged`` -> ``torch`` / ``triton``
#: (``kernels.decode_attention``, ``kernels.ragged_decode``), ``backend`` -> ``eager`` / ``compiled``
#: (``runners.generation.model_run``).
RAN = Ledger()
