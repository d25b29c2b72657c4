"""The one exception type that the command line turns into a single error line."""


class KVBenchError(Exception):
    """Bad input found before (or instead of) doing work: unknown names, bad budget, missing data."""
