"""Building a run: the checks before any work, budget, decode rule, storage kind, paths."""
