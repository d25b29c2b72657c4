"""Every job of an experiment sweep with the run config and setting id it is stored under, its
method and task built (``runners.results.sweep_jobs`` composes the jobs without building them). Tests use
it to check that every sweep point of every experiment composes and builds.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.utils import instantiate
from omegaconf import DictConfig

from runners.results.store import run_config, run_id
from runners.results.sweep_jobs import Job, composed_jobs


def sweep_jobs(
    experiment: str, scale: str = "smoke", overrides: Sequence[str] = ()
) -> tuple[DictConfig, list[Job]]:
    """The base config of ``experiment`` at ``scale`` and every job of its sweep.

    Parameters
    ----------
    experiment : str
        A name from :func:`runners.results.sweep_jobs.experiment_names`.
    scale : str
        ``smoke`` or ``paper`` (the experiment's ``scales``).
    overrides : Sequence[str]
        Extra command-line overrides, sweeps included (``method=h2o,zsmerge``).

    Raises
    ------
    KVBenchError
        For an unknown experiment.
    """
    from runners.setup.build import registered_name  # the methods and tasks (torch) load only here
    from tasks import TASK_REGISTRY

    base, composed = composed_jobs(experiment, scale, overrides)
    jobs = []
    for job_overrides, cfg in composed:
        method = instantiate(cfg.method)
        config = run_config(cfg, method.traits.budget_applies)
        task_target = (config.get("task") or {}).get("_target_")
        names = {"method": method.label, "task": registered_name(task_target, TASK_REGISTRY)}
        jobs.append(Job(job_overrides, cfg, config, run_id(config), names))
    return base, jobs
