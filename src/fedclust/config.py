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
                  secure_aggregation = true (summed rounds as secure sums, any transport;
                  "signed": the malicious-server variant)
    [baselines]   name = true for the baselines the algorithm registers
    [preprocess]  impute = "mean" | "none", scale = "standard" | "none": federated imputation
                  and scaling before the algorithm (:mod:`fedclust.sites.preprocess`); site data
                  sources ("files", "table") get it by default; under [privacy] also
                  bounds = [[low, high], ...] (public range per column) and
                  budget_share (fraction of ε for the preprocessing, default 0.2)
    [privacy]     epsilon, delta, unit, data_bound, clip_norm, noise_seed, accountant
                  (fedclust.privacy.DifferentialPrivacy), for algorithms whose estimator
                  takes privacy=; the total budget of the run, preprocessing included

Relative paths of a source that takes ``base_dir`` (the site files) are read
from the config file's folder.

What is allowed comes from :mod:`fedclust.core.registry`: a family that
registers an algorithm or a data source is configurable with no edit here.
"""

from __future__ import annotations

import copy
import re
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .core.exceptions import ConfigError, ValidationError
from .core.registry import (ALGORITHMS, BASELINES, DATA_SOURCES, accepts_privacy,
                            estimator_params, keyword_params)

__all__ = ["load_config", "check_config", "algorithm_keys", "data_keys", "partition_keys",
           "describe_config", "config_errors"]

# The keys each fixed table accepts, with what ``run --help`` says of them: the check
# and the help both read these, so the help cannot leave out a key the check accepts.
#: [simulation] key -> its help line
_SIMULATION = {
    "dropout": "fraction of devices that never reply (0..1)",
    "late": "fraction of devices that reply after the round closed (0..1)",
    "byzantine": "fraction of devices that lie on the wire (< 0.5)",
    "attack": "what the Byzantine devices send: {attacks}",
    "attack_scale": "<float> > 0, the size of the attack",
    "secure_aggregation": "true | false | \"signed\": summed rounds as secure sums (the "
                          "server learns only the sum); \"signed\" for a malicious server",
    "progress": "true for a progress bar",
}
#: top-level scalar keys -> their help line (the tables are the other top-level keys)
_SCALARS = {"seed": "<int> >= 0, every random choice of the run", "title": "<str>"}
_TOP = set(_SCALARS) | {"data", "partition", "algorithm", "simulation", "baselines",
                        "preprocess", "privacy"}
_PREPROCESS = {"impute": ("mean", "none"), "scale": ("standard", "none")}
#: [preprocess] keys of a private run: public (low, high) per column, share of ε
_PREPROCESS_PRIVACY = {
    "bounds": "[[low, high], ...], a public range per column, in the order of the encoded "
              "columns (a categorical column's one-hot columns in its place)",
    "budget_share": "fraction of ε spent on the preprocessing (0..1], default 0.2",
    "site_rows": "<int>, the most rows one site may weigh (unit = \"device\")",
}


def _check_preprocess_privacy(key: str, value: Any, private: bool, source: str) -> None:
    if not private:
        raise ConfigError(f"{source}: [preprocess] {key} is only used with a [privacy] table")
    if key == "budget_share":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ConfigError(f"{source}: [preprocess] budget_share={value!r} must be a number "
                              "in (0, 1]")
        return
    if key == "site_rows":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{source}: [preprocess] site_rows={value!r} must be an int >= 1 "
                              "(the most rows one site may weigh, unit = \"device\")")
        return
    ok = isinstance(value, list) and all(
        isinstance(r, list) and len(r) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in r) for r in value)
    if not ok or not value:
        raise ConfigError(f"{source}: [preprocess] bounds={value!r} must be a list of "
                          "[low, high] pairs, one per column")
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
    cfg = check_config(cfg, source=str(path))
    data = cfg["data"]
    if "base_dir" in data_keys(data["source"]) and "base_dir" not in data:
        data["base_dir"] = str(path.resolve().parent)  # site files next to the config
    return cfg


def _check_simulation(sim: dict, source: str) -> None:
    """The [simulation] values, with messages in the config's own words."""
    from .sim.byzantine import ATTACKS

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: [simulation] {key}={sim[key]!r} {why}")

    def number(key: str) -> float | None:
        value = sim.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise bad(key, "must be a number")
        return float(value)

    for key in ("dropout", "late"):
        value = number(key)
        if value is not None and not 0.0 <= value <= 1.0:
            raise bad(key, "must be a fraction of the devices in [0, 1]")
    alpha = number("byzantine")
    if alpha is not None and not 0.0 <= alpha < 0.5:
        raise bad("byzantine", "must be >= 0 and < 0.5 (Byzantine devices must be a minority)")
    if "attack" in sim and sim["attack"] not in ATTACKS:
        raise bad("attack", f"is not supported; choose one of {list(ATTACKS)}")
    scale = number("attack_scale")
    if scale is not None and not (scale > 0 and scale != float("inf")):
        raise bad("attack_scale", "must be a finite number > 0")
    if {"attack", "attack_scale"} & set(sim) and not alpha:
        raise ConfigError(f"{source}: [simulation] attack/attack_scale need "
                          "byzantine = <fraction> > 0")
    if "progress" in sim and not isinstance(sim["progress"], bool):
        raise bad("progress", "must be true or false")


_KEY_FIRST = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?:=|\b)")


@contextmanager
def config_errors(cfg: Mapping[str, Any], section: str, source: str = "config"
                  ) -> Iterator[None]:
    """Re-raise a :class:`ValidationError` about a key of ``cfg[section]`` as a
    :class:`ConfigError` naming the file, the table and the key.

    Estimators and data builders validate their own parameters and name them
    (``n_clusters='two' must be an integer``); inside this block such a message
    becomes ``myfed.toml: [algorithm] n_clusters='two' must be an integer``.
    """
    try:
        yield
    except ConfigError:
        raise
    except ValidationError as exc:
        match = _KEY_FIRST.match(str(exc))
        if match is None or match["key"] not in cfg.get(section, {}):
            raise
        raise ConfigError(f"{source}: [{section}] {exc}") from exc


def describe_config() -> str:
    """The tables and keys a configuration may have (``run --help``): from the registry and
    the key tables :func:`check_config` reads, so every key it accepts is listed."""
    from .core.registry import DATA_SOURCES
    from .privacy.spec import privacy_config_keys
    from .sim.byzantine import ATTACKS
    from .sim.partition import PARTITION_OPTIONS

    def entry(head: str, keys: Any) -> list[str]:
        text = ", ".join(sorted(keys)) or "(no other keys)"
        return textwrap.wrap(text, 86, initial_indent=f"    {head}: ",
                             subsequent_indent=" " * 8)

    def explain(key: str, text: str) -> list[str]:
        return textwrap.wrap(text, 86, initial_indent=f"    {key} = ",
                             subsequent_indent=" " * 8)

    lines = ["a configuration is a TOML file with these tables (unknown keys are errors):",
             "", *(f"{key} = {text}" for key, text in _SCALARS.items()), "",
             "[data]  source = one of the registered sources, then its keys:"]
    for name in DATA_SOURCES:
        federated = " (federated: no [partition])" if DATA_SOURCES[name].federated else ""
        lines += entry(f"{name}{federated}", data_keys(name))
    lines += ["", "[partition]  kind = how pooled data is split over n_devices devices:"]
    for kind in PARTITION_OPTIONS:
        lines += entry(kind, partition_keys(kind) - {"n_devices"})
    lines += ["", "[algorithm]  name = one of the registered algorithms, then its estimator's",
              "             parameters (* required):"]
    for name, algorithm in ALGORITHMS.items():
        keys = sorted(algorithm_keys(name))
        lines += entry(name, [f"{k}*" if k in algorithm.required else k for k in keys])
    lines += ["", "[simulation]  faults and secure aggregation, on either transport:"]
    for key, text in _SIMULATION.items():
        lines += explain(key, text.format(attacks=" | ".join(ATTACKS)))
    lines += ["", "[baselines]  <name> = true, among those the algorithm registers:"]
    for name, algorithm in ALGORITHMS.items():
        if algorithm.baselines:
            lines += entry(name, algorithm.baselines)
    lines += ["", "[preprocess]  federated imputation and scaling before the algorithm "
              "(site data", "              sources get impute = \"mean\", scale = "
              "\"standard\" by default):"]
    for key, choices in _PREPROCESS.items():
        lines += explain(key, " | ".join(f'"{c}"' for c in choices))
    lines += ["    under [privacy] also:"]
    for key, text in _PREPROCESS_PRIVACY.items():
        lines += explain(key, text)
    lines += ["", "[privacy]  (ε, δ)-differential privacy for the whole run, for the algorithms "
              "whose", "           estimator takes privacy=:"]
    for key, text in privacy_config_keys().items():
        lines += explain(key, text)
    return "\n".join(lines)


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
    if set(sim) - set(_SIMULATION):
        raise ConfigError(f"{source}: [simulation] has unknown keys "
                          f"{sorted(set(sim) - set(_SIMULATION))}; allowed: {sorted(_SIMULATION)}")
    _check_simulation(sim, source)
    secure = sim.get("secure_aggregation", False)
    if not (isinstance(secure, bool) or secure == "signed"):
        raise ConfigError(f"{source}: [simulation] secure_aggregation="
                          f"{sim['secure_aggregation']!r} must be true, false or \"signed\"")
    base = _table(cfg, "baselines", source)
    allowed_base = set(ALGORITHMS[algo["name"]].baselines) & set(BASELINES)
    if set(base) - allowed_base:
        raise ConfigError(
            f"{source}: [baselines] has unknown keys {sorted(set(base) - allowed_base)} for "
            f"name={algo['name']!r}; allowed: {sorted(allowed_base)}")
    pre = _table(cfg, "preprocess", source)
    for key, value in pre.items():
        if key in _PREPROCESS_PRIVACY:
            _check_preprocess_privacy(key, value, bool(cfg.get("privacy")), source)
            continue
        if key not in _PREPROCESS:
            raise ConfigError(f"{source}: [preprocess] has unknown key {key!r}; allowed: "
                              f"{sorted(set(_PREPROCESS) | set(_PREPROCESS_PRIVACY))}")
        if value not in _PREPROCESS[key]:
            raise ConfigError(f"{source}: [preprocess] {key}={value!r} must be one of "
                              f"{list(_PREPROCESS[key])}")
    priv = _table(cfg, "privacy", source)
    if priv:
        if not accepts_privacy(ALGORITHMS[algo["name"]]):
            raise ConfigError(f"{source}: [privacy] is set but algorithm {algo['name']!r} takes "
                              "no privacy parameter")
        from .privacy import DifferentialPrivacy

        try:
            DifferentialPrivacy.from_config(priv)
        except ValueError as exc:
            raise ConfigError(f"{source}: [privacy] {exc}") from None
    cfg.update(data=data, algorithm=algo, partition=part, simulation=sim, baselines=base,
               privacy=priv)
    if pre:
        cfg["preprocess"] = pre
    return cfg
