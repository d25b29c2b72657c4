"""Fault injectors the fault-injection suite (tests/test_faults.py) plugs into real runs, and every
method config resolved with what a user must give (:func:`method_configs`)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import REPO


class FailingLogger:
    """A logger that raises on every record (``+logger.boom._target_=tests.faults.FailingLogger``)."""

    def log(self, record: dict) -> None:
        """Always fail, after the run's record was written."""
        raise RuntimeError(f"injected logger failure for run {record['run_id']}")


#: What a method config leaves for the user to give.
USER_INPUT = {
    "duo_attention": ["method.pattern=tests/data/duo_pattern_2x2.tsv"],
    "layer_ratios": ["method.ratios=[1,2]"],
}


def method_configs() -> list[dict]:
    """Every method config file, resolved, with :data:`USER_INPUT` given."""
    configs = []
    for path in sorted((REPO / "configs" / "method").glob("*.yaml")):
        overrides = USER_INPUT.get(path.stem, [])
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"method={path.stem}", *overrides])
        configs.append(OmegaConf.to_container(cfg.method, resolve=True))
    return configs
