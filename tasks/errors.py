"""The one exception type that the command line turns into a single error line (raised by tasks,
runners and reports alike, so it lives in the lowest layer that raises it)."""


class KVBenchError(Exception):
    """Bad input found before (or instead of) doing work: unknown names, bad budget, missing data."""
