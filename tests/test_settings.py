"""The raw config is read once, at the door (``runners.setup.settings.read_settings``): the build reads
the typed :class:`~runners.setup.settings.RunSettings` made there, and a runner gets that object."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir

import runners.quality
import runners.registry
from runners.quality import check_batch_size
from runners.registry import run_from_config
from runners.setup.build import build_components, refuse_untrained, run_budget
from runners.setup.options import QuantOptions, Shards
from runners.setup.quant_kind import storage_of
from runners.setup.settings import RunSettings, read_settings
from tests.conftest import REPO


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_door_makes_typed_settings(tmp_path):
    """Top-level options typed, ``quant`` and ``runner`` as their option dataclasses, the composed
    config kept for the run's identity (``compression_ratio``: tests/test_cli.py)."""
    cfg = composed("quant=int8", "budget=0.25", "runner.batch_size=2", f"paths.results_dir={tmp_path}")
    settings = read_settings(cfg)
    assert settings.budget == 0.25 and settings.config is cfg
    assert settings.quant == QuantOptions(name="int8", bits=8, group=64)
    assert dict(settings.quant_params) == {"bits": 8, "group": 64}
    assert isinstance(settings.runner, Shards) and settings.runner.batch_size == 2
    assert settings.paths.results_dir == str(tmp_path) and settings.seed == 0 and settings.rerun is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.budget = 0.5  # type: ignore[misc]


def test_the_build_reads_the_settings_not_the_composed_config(tmp_path):
    """Every build step of a quality run works with the composed config taken out of the settings."""
    settings = read_settings(composed("method=snapkv", "quant=int8", f"paths.results_dir={tmp_path}"))
    blind = dataclasses.replace(settings, config=None)
    refuse_untrained(blind)
    assert check_batch_size(blind) == 1
    method, task = build_components(blind)
    assert storage_of(blind, method) is not None and run_budget(blind, method) == settings.budget
    assert task.name == "xsum" and settings.model.max_context  # the model's config filled the node


def test_run_quality_gets_the_settings_made_once_at_the_door(tmp_path, monkeypatch):
    """``run.py``'s entry point reads the config into settings once; the quality runner builds from
    that very object."""
    made, built = [], []

    def door(cfg) -> RunSettings:
        made.append(read_settings(cfg))
        return made[-1]

    class StopError(Exception):
        pass

    def stop(settings: RunSettings):
        built.append(settings)
        raise StopError

    monkeypatch.setattr(runners.registry, "read_settings", door)
    monkeypatch.setattr(runners.quality, "build_components", stop)
    with pytest.raises(StopError):
        run_from_config(composed("method=snapkv", f"paths.results_dir={tmp_path}"))
    assert len(made) == 1 and len(built) == 1 and built[0] is made[0]
