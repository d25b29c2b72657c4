"""Fault injectors the fault-injection suite (tests/test_faults.py) plugs into real runs."""

from __future__ import annotations


class FailingLogger:
    """A logger that raises on every record (``+logger.boom._target_=tests.faults.FailingLogger``)."""

    def log(self, record: dict) -> None:
        """Always fail, after the run's record was written."""
        raise RuntimeError(f"injected logger failure for run {record['run_id']}")
