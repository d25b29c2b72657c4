"""Benchmarks: ``TASK_REGISTRY`` maps a task's name to its class (``configs/task/<name>.yaml``).

The names below load on first use (PEP 562), so ``tasks.errors`` and ``tasks.data`` import without
the benchmarks (and torch): reports raise ``tasks.errors.KVBenchError`` without loading them.
"""

from __future__ import annotations

import importlib

#: Public name -> the module defining it.
_MODULES = {
    "Sample": "tasks.base",
    "Task": "tasks.base",
    "XSum": "tasks.xsum",
    "CNNDailyMail": "tasks.cnndm",
    "LongBench": "tasks.longbench",
    "InfiniteBench": "tasks.infinitebench",
    "GSMInfinite": "tasks.gsm_infinite",
    "Ruler": "tasks.ruler",
}
_REGISTERED = ("XSum", "CNNDailyMail", "LongBench", "InfiniteBench", "GSMInfinite", "Ruler")

__all__ = ["TASK_REGISTRY", *sorted(_MODULES)]


def __getattr__(name: str) -> object:
    """``TASK_REGISTRY`` (task name -> class) and the task classes, imported on first use."""
    if name == "TASK_REGISTRY":
        classes = [__getattr__(n) for n in _REGISTERED]
        value: object = {cls.name: cls for cls in classes}
    elif name in _MODULES:
        value = getattr(importlib.import_module(_MODULES[name]), name)
    else:
        raise AttributeError(f"module 'tasks' has no attribute {name!r}")
    globals()[name] = value
    return value
