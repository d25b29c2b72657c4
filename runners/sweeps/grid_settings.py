"""The settings of a grid (``runner=quality_grid``): each one's config, composed as ``run.py`` composes
its own run.

The grid is ``runner.methods`` x (``runner.compression_ratios`` or ``runner.budgets``) x
``runner.quants``, plus any ``runner.extra_grids``: more such products sharing the same prefill per
sample, each with ``overrides`` of its own that a setting may change without changing the prompts
(``decode_budget=``, ``method.*``). A leaderboard's rows at several ratios, and the decode-time rule of
some of its methods, then take one prefill per sample::

    'runner.extra_grids=[{methods:[tova,knorm],compression_ratios:[0.5],overrides:["decode_budget=true"]}]'
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig

from runners.results.store import quant_of
from runners.sweeps.shards import check_shards
from tasks.errors import KVBenchError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: Overrides of the grid job that do not pass to its settings (the grid's own keys; ``quant`` with
#: ``runner.quants``).
GRID_KEYS = ("runner", "method", "budget", "compression_ratio")
#: Keys of the grid's runner that its settings take: every setting runs the same shard of the samples.
SHARD_KEYS = ("num_shards", "shard_index")
#: Keys of one of ``runner.extra_grids``.
EXTRA_KEYS = ("methods", "compression_ratios", "budgets", "quants", "overrides")
#: What an extra grid's ``overrides`` may set: a setting's decoding rule and its method's parameters,
#: nothing that changes the samples, the prompts or the model the settings share.
EXTRA_OVERRIDES = ("decode_budget", "method.")


@dataclass(frozen=True)
class Axes:
    """One product of the grid: its presets, budget axis, storage kinds and own overrides."""

    where: str
    methods: list[str]
    key: str
    values: list
    quants: list[str | None]
    overrides: list[str]


def _values(node: DictConfig, where: str) -> tuple[str, list]:
    """The budget axis of ``node``: ``("compression_ratio", [...])`` or ``("budget", [...])``."""
    ratios, budgets = node.get("compression_ratios"), node.get("budgets")
    if (ratios is None) == (budgets is None):
        raise KVBenchError(f"runner=quality_grid takes one of {where}.compression_ratios, {where}.budgets")
    key, values = ("compression_ratio", ratios) if ratios is not None else ("budget", budgets)
    if not isinstance(values, ListConfig) or not values:
        raise KVBenchError(f"{where}.{key}s must be a non-empty list, got {values!r}")
    return key, list(values)


def _quants(node: DictConfig, where: str, given: list[str], names: list[str]) -> list[str | None]:
    """The storage axis of ``node`` (None: every setting takes the job's ``quant``)."""
    quants = node.get("quants")
    if quants is None:
        return [None]
    if not isinstance(quants, ListConfig) or not quants or len(set(quants)) != len(quants):
        raise KVBenchError(f"{where}.quants must be a non-empty list of distinct quant names, got {quants!r}")
    if bad := [o for o, n in zip(given, names, strict=True) if n == "quant"]:
        raise KVBenchError(f"{where}.quants gives each setting its quant; {bad[0]} would be ignored")
    return [str(q) for q in quants]


def _check_batched_quant(cfg: DictConfig, quants: list[str | None]) -> None:
    """Refuse ``runner.batch_size`` > 1 with quantized settings: a setting is stored under the id of its
    own batch-1 run, and batched products round differently from one row's (by ~1e-6 relative on a
    CPU); a quantized store turns that into a different code now and then, so batched settings would
    not give their own runs' tokens (FullKV int8, XSum: 6 of 20 predictions differ at batch 12)."""
    names = [quant_of(cfg) if q is None else q for q in quants]
    batch = cfg.runner.get("batch_size", 1)
    if batch != 1 and (quantized := [q for q in names if q != "none"]):
        raise KVBenchError(
            f"runner=quality_grid with quant={quantized[0]} takes runner.batch_size=1 (got {batch}): its "
            "settings are stored as their own batch-1 runs, and batched decoding of quantized caches "
            "gives other tokens now and then"
        )


def _axes(cfg: DictConfig, node: DictConfig, where: str, given: list[str], names: list[str]) -> Axes:
    """The checked product ``node`` (``cfg.runner`` or one of its ``extra_grids``) describes; only an
    extra grid has ``overrides``."""
    methods = node.get("methods")
    if not isinstance(methods, ListConfig) or not methods:
        raise KVBenchError(f"{where}.methods must be a non-empty list of method presets, got {methods!r}")
    key, values = _values(node, where)
    quants = _quants(node, where, given, names)
    _check_batched_quant(cfg, quants)
    overrides = (node.get("overrides") or []) if where != "runner" else []
    if not isinstance(overrides, ListConfig | list) or not all(isinstance(o, str) for o in overrides):
        raise KVBenchError(f"{where}.overrides must be a list of 'key=value' strings, got {overrides!r}")
    for o in overrides:
        name = o.split("=")[0].lstrip("+~")
        if "=" not in o or not (name == EXTRA_OVERRIDES[0] or name.startswith(EXTRA_OVERRIDES[1])):
            raise KVBenchError(
                f"{where}.overrides: {o!r} is refused; an extra grid may set decode_budget= and method.* "
                "(its settings share the job's samples, prompts and model)"
            )
    return Axes(where, [str(m) for m in methods], key, values, quants, [str(o) for o in overrides])


def _extra_grids(cfg: DictConfig, given: list[str], names: list[str]) -> list[Axes]:
    """``runner.extra_grids``, checked."""
    extra = cfg.runner.get("extra_grids")
    if extra is None:
        return []
    if not isinstance(extra, ListConfig):
        raise KVBenchError(f"runner.extra_grids must be a list of grids, got {extra!r}")
    out = []
    for i, node in enumerate(extra):
        where = f"runner.extra_grids[{i}]"
        if not isinstance(node, DictConfig) or (unknown := set(node) - set(EXTRA_KEYS)):
            found = sorted(unknown) if isinstance(node, DictConfig) else node
            raise KVBenchError(f"{where} takes the keys {list(EXTRA_KEYS)}, got {found!r}")
        out.append(_axes(cfg, node, where, given, names))
    return out


def setting_configs(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """``(method preset, composed config)`` of every setting, in order: the job's overrides (those of
    the grid itself left out), an extra grid's own ``overrides``, then ``method=<preset>``, the ratio or
    budget and (``quants``) ``quant=<q>``, composed as ``run.py`` composes them. A setting may come
    twice (FullKV ignores the budget); the caller keeps one per run.

    Raises
    ------
    KVBenchError
        For an empty or malformed grid or extra grid, ``method.*`` overrides of the job (they would apply
        to every preset), a ``quant=`` override beside ``quants``, an extra grid's override other than
        ``decode_budget=`` or ``method.*``, ``backend=compiled``, or a preset that does not compose.
    """
    given = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    names = [o.split("=")[0].lstrip("+~") for o in given]
    if bad := [o for o, n in zip(given, names, strict=True) if n.startswith("method.")]:
        raise KVBenchError(f"runner=quality_grid runs several method presets; {bad[0]} would apply to all")
    if bad := [o for o, n in zip(given, names, strict=True) if n in GRID_KEYS[1:]]:
        raise KVBenchError(f"runner=quality_grid takes its settings from runner.*; {bad[0]} would be ignored")
    if cfg.get("backend", "eager") != "eager":
        raise KVBenchError(
            "runner=quality_grid runs eager decode steps (one compiled forward cannot serve every "
            "setting's method); run backend=compiled settings one by one"
        )
    grids = [_axes(cfg, cfg.runner, "runner", given, names), *_extra_grids(cfg, given, names)]
    kept = [o for o, n in zip(given, names, strict=True) if n.split(".")[0] not in GRID_KEYS]
    kept += [f"runner.{key}={value}" for key, value in zip(SHARD_KEYS, check_shards(cfg), strict=True)]
    out = []
    with contextlib.ExitStack() as stack:
        if not GlobalHydra.instance().is_initialized():
            stack.enter_context(initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"))
        for grid in grids:
            for preset, value, quant in itertools.product(grid.methods, grid.values, grid.quants):
                asked = [*grid.overrides, f"{grid.key}={value}", *([f"quant={quant}"] if quant else [])]
                try:
                    out.append((preset, compose("config", overrides=[*kept, f"method={preset}", *asked])))
                except Exception as err:
                    first, given_here = str(err).splitlines()[0], " ".join(asked)
                    raise KVBenchError(f"{grid.where}.methods: {preset} with {given_here}: {first}") from err
    return out
