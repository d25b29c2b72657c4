"""The jobs of an experiment sweep, as Hydra's basic sweeper would launch them, composed without
running or building them (no torch).

Reports use this to list what an experiment should have produced (and what is missing);
``runners.sweeps.experiment_jobs.sweep_jobs`` builds each job's method for its run id.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from tasks.errors import KVBenchError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass
class Job:
    """One sweep point: its overrides (``key=value``), composed config, the resolved config its
    run is stored under (``runners.results.store.run_config``), its run id and registry names.

    ``run_id`` is the setting id (``runners.results.store.setting_id``; the runs of that setting are
    stored under ``<setting id>-<inputs hash>``) until a report matches the job with its record."""

    overrides: list[str]
    cfg: DictConfig
    config: dict
    run_id: str
    names: dict[str, str | None]

    def name(self, group: str) -> str | None:
        """Registry name of the job's ``method`` or ``task`` (None for a runner without a task)."""
        return self.names.get(group)

    def choice(self, key: str) -> str | None:
        """The value this job's overrides give ``key`` (a config group choice or a field), as text."""
        for item in self.overrides:
            name, _, value = item.partition("=")
            if name.lstrip("+~") == key:
                return value
        return None


def experiment_names() -> list[str]:
    """Every ``configs/experiment/<name>.yaml``."""
    return sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


@contextmanager
def _hydra() -> Iterator[None]:
    if GlobalHydra.instance().is_initialized():  # inside a Hydra app or a test's initialize
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        yield


def _job_overrides(base: DictConfig, extra: Sequence[str]) -> list[list[str]]:
    params = base.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(extra)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return batches[0] if batches else [[]]


def composed_jobs(
    experiment: str, scale: str = "smoke", overrides: Sequence[str] = ()
) -> tuple[DictConfig, list[tuple[list[str], DictConfig]]]:
    """The base config of ``experiment`` at ``scale`` and each sweep job's overrides and composed
    config, without building methods or tasks (no torch: reports use this).

    Raises
    ------
    KVBenchError
        For an unknown experiment.
    """
    if experiment not in experiment_names():
        raise KVBenchError(f"unknown experiment {experiment!r} (known: {', '.join(experiment_names())})")
    head = [f"experiment={experiment}", f"scale={scale}"]
    with _hydra():
        base = compose(config_name="config", overrides=head, return_hydra_config=True)
        jobs = [
            (list(job_overrides), compose(config_name="config", overrides=head + list(job_overrides)))
            for job_overrides in _job_overrides(base, overrides)
        ]
    base = OmegaConf.masked_copy(base, [k for k in base if k != "hydra"])
    return base, jobs
