"""Experiment configurations (TOML): read, check, fill defaults.

A configuration has four tables; unknown keys are errors (a typo must not be
silently ignored)::

    seed = 0
    [data]        source = a registered data source ("gaussians", "mnist", "npz",
                  "benchmark", ...) + the keyword parameters of its builder
    [partition]   kind = "iid" | "structured" | "dirichlet" | "power-law" | ..., n_devices, ...
                  (not used for sources that come federated by construction)
    [algorithm]   name = a registered algorithm ("kfed", ...) + its estimator's parameters
    [simulation]  dropout, late, progress; byzantine (fraction of devices that lie on the
                  wire, on either transport), attack (fedclust.sim.byzantine.ATTACKS), attack_scale;
                  secure_aggregation = true (summed rounds as secure sums, any transport)
    [baselines]   name = true for the baselines the algorithm registers

What is allowed comes from :mod:`fedclust.core.registry`: a family that
registers an algorithm or a data source is configurable with no edit here.
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

from .core.exceptions import ConfigError
from .core.registry import (ALGORITHMS, BASELINES, DATA_SOURCES, estimator_params,
                            keyword_params)

__all__ = ["load_config", "check_config", "algorithm_keys", "data_keys", "partition_keys"]

_SIMULATION = {"dropout", "late", "progress", "byzantine", "attack", "attack_scale",
               "secure_aggregation"}
_TOP = {"seed", "data", "partition", "algorithm", "simulation", "baselines", "title"}
#: [data] keys every pooled (non-federated) source accepts: a random subsample
_POOLED = {"n_samples"}


def algorithm_keys(name: str) -> set[str]:
    """Keys an ``[algorithm]`` table with this name may set (its estimator's parameters)."""
    return set(estimator_params(ALGORITHMS[name]))


def data_keys(source: str) -> set[str]:
    src = DATA_SOURCES[source]
    keys = set(keyword_params(src.build, skip=("seed",)))
    return keys if src.federated else keys | _POOLED


def partition_keys(kind: str) -> set[str]:
    from .sim.partition import PARTITION_OPTIONS

    return {"n_devices"} | set(PARTITION_OPTIONS[kind])


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
    from .sim.partition import PARTITION_OPTIONS

    kinds, keys_of = {"data": (DATA_SOURCES, data_keys),
                      "algorithm": (ALGORITHMS, algorithm_keys),
                      "partition": (PARTITION_OPTIONS, partition_keys)}[name]
    kind = table.get(kind_key)
    if kind not in kinds:
        raise ConfigError(
            f"{source}: [{name}] {kind_key}={kind!r} is not supported; choose one of {sorted(kinds)}")
    allowed = keys_of(kind)
    unknown = set(table) - allowed - {kind_key}
    if unknown:
        raise ConfigError(
            f"{source}: [{name}] has unknown keys {sorted(unknown)} for {kind_key}={kind!r}; "
            f"allowed: {sorted(allowed)}")


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
        raise ConfigError(f"{source}: [data] needs source = one of {sorted(DATA_SOURCES)}")
    _check_kind(data, "data", "source", source)
    algo = _table(cfg, "algorithm", source)
    algo.setdefault("name", next(iter(ALGORITHMS)))  # the first registered family
    _check_kind(algo, "algorithm", "name", source)
    missing = [k for k in ALGORITHMS[algo["name"]].required if k not in algo]
    if missing:
        raise ConfigError(f"{source}: [algorithm] name={algo['name']!r} needs {', '.join(missing)}")
    part = _table(cfg, "partition", source)
    if not DATA_SOURCES[data["source"]].federated:
        if not part:
            raise ConfigError(
                f"{source}: source={data['source']!r} needs a [partition] table (kind, n_devices)")
        _check_kind(part, "partition", "kind", source)
        if "n_devices" not in part:
            raise ConfigError(f"{source}: [partition] needs n_devices")
    elif part:
        raise ConfigError(
            f"{source}: source={data['source']!r} is federated by construction; remove [partition]")
    sim = _table(cfg, "simulation", source)
    if set(sim) - _SIMULATION:
        raise ConfigError(f"{source}: [simulation] has unknown keys {sorted(set(sim) - _SIMULATION)}")
    if not isinstance(sim.get("secure_aggregation", False), bool):
        raise ConfigError(f"{source}: [simulation] secure_aggregation="
                          f"{sim['secure_aggregation']!r} must be true or false")
    base = _table(cfg, "baselines", source)
    allowed_base = set(ALGORITHMS[algo["name"]].baselines) & set(BASELINES)
    if set(base) - allowed_base:
        raise ConfigError(
            f"{source}: [baselines] has unknown keys {sorted(set(base) - allowed_base)} for "
            f"name={algo['name']!r}; allowed: {sorted(allowed_base)}")
    cfg.update(data=data, algorithm=algo, partition=part, simulation=sim, baselines=base)
    return cfg
