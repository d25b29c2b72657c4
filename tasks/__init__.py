"""Benchmarks: ``TASK_REGISTRY`` maps ``task=<name>`` to its class."""

from tasks.base import Sample, Task
from tasks.xsum import XSum

TASK_REGISTRY: dict[str, type[Task]] = {cls.name: cls for cls in (XSum,)}

__all__ = ["TASK_REGISTRY", "Sample", "Task", "XSum"]
