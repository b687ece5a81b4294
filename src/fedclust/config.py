"""Experiment configurations (TOML): read, check, fill defaults.

A configuration has four tables; unknown keys are errors (a typo must not be
silently ignored)::

    seed = 0
    [data]        source = "gaussians" | "mnist" | "npz" | "benchmark", + source keys
    [partition]   kind = "iid" | "structured" | "dirichlet" | "power-law", n_devices, ...
                  (not used for "gaussians", which come federated by construction)
    [algorithm]   name = "kfed" | "distributed-lloyd", + its parameters
    [simulation]  dropout, late, progress
    [baselines]   centralized = true, distributed_lloyd = true
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .exceptions import ConfigError

__all__ = ["load_config", "check_config", "DEMO_CONFIG"]

_ALLOWED: dict[str, dict[str, set[str]]] = {
    "data": {
        "gaussians": {"n_features", "n_clusters", "n_local_clusters", "m0", "separation",
                      "n_per_component", "sigma"},
        "mnist": {"path", "subset", "n_samples", "scale"},
        "npz": {"path", "n_samples"},
        "benchmark": {"name", "data_dir", "n_samples"},
    },
    "partition": {
        "iid": {"n_devices"},
        "structured": {"n_devices", "n_local_clusters", "m0"},
        "dirichlet": {"n_devices", "alpha", "min_size"},
        "power-law": {"n_devices", "exponent", "min_size"},
    },
    "algorithm": {
        "kfed": {"n_clusters", "n_local_clusters", "server", "weighted", "first_device",
                 "max_iter", "tol", "local_max_iter", "allow_raw_points"},
        "distributed-lloyd": {"n_clusters", "points_per_device", "max_rounds", "tol"},
    },
}
_SIMULATION = {"dropout", "late", "progress"}
_BASELINES = {"centralized", "distributed_lloyd"}
_TOP = {"seed", "data", "partition", "algorithm", "simulation", "baselines", "title"}

#: The embedded default run by ``fedclust demo``: a reduced Table-1 federation of k-FED.
DEMO_CONFIG: dict[str, Any] = {
    "title": "k-FED on a Table-1 Gaussian mixture (d=100, k=16, k'=4, m0=5, c=100)",
    "seed": 0,
    "data": {"source": "gaussians", "n_features": 100, "n_clusters": 16, "n_local_clusters": 4,
             "m0": 5, "separation": 100.0, "n_per_component": 500},
    "algorithm": {"name": "kfed", "n_clusters": 16, "n_local_clusters": 4},
    "simulation": {"dropout": 0.0, "late": 0.0},
    "baselines": {"centralized": True, "distributed_lloyd": True},
}


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a TOML file and check it; errors name the file and the key."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            cfg = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return check_config(cfg, source=str(path))


def _table(cfg: dict, key: str, source: str) -> dict:
    value = cfg.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{key}] must be a table, got {value!r}")
    return dict(value)


def _check_kind(table: dict, name: str, kind_key: str, source: str) -> None:
    allowed = _ALLOWED[name]
    kind = table.get(kind_key)
    if kind not in allowed:
        raise ConfigError(
            f"{source}: [{name}] {kind_key}={kind!r} is not supported; choose one of {sorted(allowed)}")
    unknown = set(table) - allowed[kind] - {kind_key}
    if unknown:
        raise ConfigError(
            f"{source}: [{name}] has unknown keys {sorted(unknown)} for {kind_key}={kind!r}; "
            f"allowed: {sorted(allowed[kind])}")


def check_config(cfg: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate the structure of a configuration and return a filled copy."""
    cfg = copy.deepcopy(cfg)
    unknown = set(cfg) - _TOP
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {sorted(unknown)}; allowed: {sorted(_TOP)}")
    seed = cfg.setdefault("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"{source}: seed={seed!r} must be a non-negative integer")
    data = _table(cfg, "data", source)
    if "source" not in data:
        raise ConfigError(f"{source}: [data] needs source = one of {sorted(_ALLOWED['data'])}")
    _check_kind(data, "data", "source", source)
    algo = _table(cfg, "algorithm", source)
    algo.setdefault("name", "kfed")
    _check_kind(algo, "algorithm", "name", source)
    if "n_clusters" not in algo:
        raise ConfigError(f"{source}: [algorithm] needs n_clusters")
    if algo["name"] == "kfed" and "n_local_clusters" not in algo:
        raise ConfigError(f"{source}: [algorithm] name='kfed' needs n_local_clusters")
    part = _table(cfg, "partition", source)
    if data["source"] != "gaussians":
        if not part:
            raise ConfigError(
                f"{source}: source={data['source']!r} needs a [partition] table (kind, n_devices)")
        _check_kind(part, "partition", "kind", source)
        if "n_devices" not in part:
            raise ConfigError(f"{source}: [partition] needs n_devices")
    elif part:
        raise ConfigError(
            f"{source}: source='gaussians' is federated by construction (groups over m0 devices); "
            "remove [partition]")
    sim = _table(cfg, "simulation", source)
    if set(sim) - _SIMULATION:
        raise ConfigError(f"{source}: [simulation] has unknown keys {sorted(set(sim) - _SIMULATION)}")
    base = _table(cfg, "baselines", source)
    if set(base) - _BASELINES:
        raise ConfigError(f"{source}: [baselines] has unknown keys {sorted(set(base) - _BASELINES)}")
    cfg.update(data=data, algorithm=algo, partition=part, simulation=sim, baselines=base)
    return cfg
