"""Every option of every config group composes; method/task/model configs validate and build."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from methods import METHOD_REGISTRY
from runners.models.loading import resolve_model_config, validate_model_config
from runners.models.sources import MODEL_SOURCES
from runners.results.sweep_jobs import experiment_names
from runners.setup.build import registered_name
from runners.sweeps.experiment_jobs import sweep_jobs
from tasks.errors import KVBenchError
from tests.conftest import REPO

CONFIGS = REPO / "configs"
GROUPS = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


GLOBAL_GROUPS = ("experiment", "hparams_search")  # global packages: they set fields, not a node


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes(group, option):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"{group}={option}"], return_hydra_config=True)
    if group not in GLOBAL_GROUPS:
        assert cfg[group] is not None
    else:  # each sweeps something: a grid (experiment) or a search space (Optuna)
        assert cfg.hydra.sweeper.params and cfg.hydra.runtime.choices[group] == option


def test_experiment_glob_matches_the_experiment_files():
    """``experiment=glob(*)`` (what a user sweeps over every artefact with) lists every file."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        (batch,) = BasicSweeper.split_arguments(parser.parse_overrides(["experiment=glob(*)"]), None)
    names = sorted(job[0].removeprefix("experiment=") for job in batch)
    assert names == experiment_names() and len(names) >= 12


#: The throughput tables: random weights of a shape at every scale (smoke: SmolLM2's, 2 layers),
#: and the scales each has (``cpu``: 2 layers of Llama-2-7B's shape).
RANDOM_WEIGHTS = {
    "zsmerge_table1": ("smoke", "cpu", "paper"),
    "keepkv_table1": ("smoke", "cpu", "paper"),
    "keepkv_table1_maxbatch": ("smoke", "paper"),
}


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
@pytest.mark.parametrize("option", options("experiment"))
def test_every_experiment_sweep_job_composes_and_validates(option, scale):
    """Every job ``python run.py -m experiment=<option> scale=<scale>`` would launch composes, its
    method builds, and it names the model the scale asks for; smoke runs the embedded model, or for
    the throughput tables random weights of its shape; ``cpu`` is the throughput tables' alone. A
    random model's composed config is the one its run records (the report finds runs by it)."""
    if scale not in RANDOM_WEIGHTS.get(option, ("smoke", "paper")):
        pytest.skip(f"{option} has no scale={scale}")
    base, jobs = sweep_jobs(option, scale)
    assert jobs and base.report.kind in ("table", "sensitivity", "curve", "error")
    for job in jobs:
        assert job.name("method") in METHOD_REGISTRY
        validate_model_config(job.cfg.model)
        if job.cfg.model.loader == "random":
            resolved = OmegaConf.create(job.config["model"])
            resolve_model_config(resolved)  # fills the null fields as a run does (no weights built)
            assert OmegaConf.to_container(resolved) == job.config["model"], option
    models = {job.cfg.model.name for job in jobs}
    if option in RANDOM_WEIGHTS:
        assert {job.cfg.model.loader for job in jobs} == {"random"}
        shape = "smollm2-135m" if scale == "smoke" else "llama2-7b"
        assert {job.cfg.model.shape for job in jobs} == {shape}
        assert {job.cfg.model.num_layers for job in jobs} == ({None} if scale == "paper" else {2})
        return
    assert (models == {"smollm2-135m"}) == (scale == "smoke")
    if scale == "smoke":
        assert {job.cfg.model.loader for job in jobs} == {"embedded_gguf"}


def test_defaults_are_the_main_job():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config")
    assert (cfg.model.name, cfg.task.limit, cfg.budget) == ("smollm2-135m", 20, 0.05)
    assert cfg.logger.wandb.mode == "offline"


@pytest.mark.parametrize("option", options("method"))
def test_method_configs_build_registered_methods(option):
    from tests.method_settings import build_preset  # fills what a user must give (a pattern, ratios)

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"method={option}"])
    method = build_preset(option)
    assert METHOD_REGISTRY[method.name] is type(method)
    assert option.startswith(method.name)
    # the runners' check of a target: a class exported by a subpackage (methods.keepkv.KeepKV) counts
    assert registered_name(cfg.method._target_, METHOD_REGISTRY) == method.name


@pytest.mark.parametrize("option", options("model"))
def test_model_configs_validate_without_loading(option):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={option}"])
    assert cfg.model.loader in MODEL_SOURCES
    if option in ("hf", "gguf", "random"):  # the generic ways: the user names the model (random: a shape)
        assert cfg.model.max_context is None and cfg.model.name is None
        with pytest.raises(KVBenchError, match=r"needs model\.(id|path|shape)"):
            validate_model_config(cfg.model)
        return
    assert cfg.model.max_context > 0  # presets fix the paper's context
    validate_model_config(cfg.model)


def test_overrides_reach_the_method():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["method.alpha=0.5", "budget=512", "task.limit=100"])
    assert instantiate(cfg.method).alpha == 0.5 and cfg.budget == 512 and cfg.task.limit == 100


ZSMERGE_PRESETS = {  # docs/methods.md, "ZSMerge" (its presets table)
    "zsmerge": {"proximity_ratio": 0.5, "residual_ratio": 0.02, "alpha": 1.0, "lam": 0.98, "window_size": 8},
    "zsmerge_xsum_code": {"proximity_ratio": 0.4, "residual_ratio": 1, "alpha": 0.6, "window_size": None},
    "zsmerge_xsum_paper": {"proximity_ratio": 0.5, "residual_ratio": 2, "alpha": 1.0},
    "zsmerge_longbench": {"proximity_ratio": 0.2, "residual_ratio": 2, "alpha": 0.8, "window_size": 8},
    "zsmerge_infinitebench": {"proximity_ratio": 0.02, "residual_ratio": 0.5, "alpha": 1.0},
    "zsmerge_gsm_infinite": {
        "proximity_ratio": 0.1,
        "residual_ratio": 0.05,
        "alpha": 0.9,
        "lam": 0.8,
        "window_size": 16,
    },
}


PRESETS = ZSMERGE_PRESETS | {
    "keepkv": {"merge": "zip", "estimator": "ema", "layer_budgets": "uniform", "threshold": 0.8, "n_sink": 4},
    "keepkv_code": {"merge": "convex", "estimator": "window_mean", "layer_budgets": "cosine"},
    "kvmerger": {"recent_ratio": 0.17, "heavy_ratio": 0.12, "theta": 0.75, "exact_budget": False},
    "kvmerger_35": {"recent_ratio": 0.08, "heavy_ratio": 0.02, "theta": 0.75},
}


@pytest.mark.parametrize(("preset", "expected"), PRESETS.items())
def test_presets_match_the_settings_tables(preset, expected):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"method={preset}"])
    method = instantiate(cfg.method)
    assert {k: getattr(method, k) for k in expected} == expected
