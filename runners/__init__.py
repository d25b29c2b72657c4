"""Runners: ``runners.registry.RUNNER_REGISTRY`` maps ``runner.name`` to the function that runs a job.

Nothing below runners/ imports from it: ``tasks.errors.KVBenchError``, the result store and the
run identity (``reports.store``) and the sweep jobs (``reports.sweep_jobs``) live in the layers
that tasks and reports may import.
"""
