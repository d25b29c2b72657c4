"""Which method preset (``configs/method/<preset>.yaml``) a stored run used, read from the YAML
files with OmegaConf: reports never import the methods (and so never torch).

A record stores the resolved method config, not the name it was chosen by; the preset is the
file of the same ``_target_`` that differs from it in the fewest hyperparameters, and the
remaining differences are the settings given on the command line (``residual_ratio=0``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from omegaconf import OmegaConf

METHOD_DIR = Path(__file__).resolve().parent.parent / "configs" / "method"


def _load(name: str) -> dict:
    node = OmegaConf.load(METHOD_DIR / f"{name}.yaml")
    merged: dict = {}
    own = {k: v for k, v in OmegaConf.to_container(node).items() if k != "defaults"}
    for entry in node.get("defaults") or []:
        merged |= own if entry == "_self_" else _load(str(entry))
    if "_self_" not in (node.get("defaults") or []):
        merged |= own
    return merged


@cache
def presets() -> dict[str, dict]:
    """Every method preset: file name -> its composed hyperparameters (``_target_`` included)."""
    return {p.stem: _load(p.stem) for p in sorted(METHOD_DIR.glob("*.yaml"))}


def _value(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def differences(config: dict, preset: dict, base: dict) -> dict:
    """Hyperparameters where ``config`` differs from ``preset``; a key the config lacks takes the
    method's base value (``base``)."""
    keys = [k for k in dict.fromkeys([*preset, *config]) if k not in ("_target_", "decode_budget")]
    full = base | config
    return {k: full.get(k) for k in keys if full.get(k) != preset.get(k, base.get(k))}


def identify(method: str, config: dict) -> tuple[str, str]:
    """The preset a run's method config comes from and the settings it changes.

    Parameters
    ----------
    method : str
        The record's registry name (``zsmerge``); its own file is the base preset.
    config : dict
        The record's ``config.method``.

    Returns
    -------
    tuple[str, str]
        The preset name (``method`` itself when no file matches better) and the differing
        hyperparameters as ``key=value`` text (empty when the run is the preset as it is).
    """
    table = presets()
    base = table.get(method, {})
    target = config.get("_target_", base.get("_target_"))
    candidates = {n: p for n, p in table.items() if p.get("_target_") == target} or {method: base}
    scored = sorted(
        (len(differences(config, p, base)), n != method, len(n), n) for n, p in candidates.items()
    )
    name = scored[0][3]
    diff = differences(config, candidates[name], base)
    return name, " ".join(f"{k}={_value(v)}" for k, v in diff.items())


def non_default_settings(method: str, config: dict) -> str:
    """Hyperparameters of a run's method config that differ from the method's own
    ``configs/method/<method>.yaml`` (``merge=convex``)."""
    base = presets().get(method, {})
    return " ".join(f"{k}={_value(v)}" for k, v in differences(config, base, base).items())


def method_of(preset: str) -> str:
    """The registry name of a preset's method (``zsmerge_xsum_paper`` -> ``zsmerge``): the base
    file with the same ``_target_`` (a name that is no preset is returned as it is)."""
    table = presets()
    target = table.get(preset, {}).get("_target_")
    bases = [n for n, p in table.items() if p.get("_target_") == target and "defaults" not in _raw(n)]
    return min(bases, key=len) if target and bases else preset


@cache
def _raw(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(METHOD_DIR / f"{name}.yaml"))


#: ``_target_`` -> whether a method config ignores the budget: the reports' copy of
#: ``Traits.budget_applies`` (no torch here), used only to name the run id of a run
#: that is not stored yet; tests check it against every method config (tests/test_failure_records.py).
BUDGET_IGNORED: dict[str, object] = {
    "methods.dms.DMS": lambda config: True,
    "methods.duo_attention.DuoAttention": lambda config: True,
    "methods.fullkv.FullKV": lambda config: True,
    "methods.kvmerger.KVMerger": lambda config: not config.get("exact_budget", False),
    "methods.simlayerkv.SimLayerKV": lambda config: True,
    # ThinK prunes channels; its tokens are its inner method's (``press``, default FullKV)
    "methods.think.ThinK": lambda config: budget_ignored(
        config.get("press") or {"_target_": "methods.fullkv.FullKV"}
    ),
}


def budget_ignored(config: dict) -> bool:
    """Whether the method config ``config`` (with ``_target_``) ignores the budget."""
    rule = BUDGET_IGNORED.get(config.get("_target_", ""))
    return bool(rule(config)) if rule else False
