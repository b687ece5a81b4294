"""``fedclust run --help`` lists every table and key the configuration check accepts.

The help is parsed table by table; each table's keys are compared with what
:func:`fedclust.config.check_config` accepts, probed key by key (a key it
refuses as unknown must not be listed; a key it accepts must be)."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields

import pytest

from fedclust.cli import main
from fedclust.config import algorithm_keys, check_config, data_keys, partition_keys
from fedclust.core.exceptions import ConfigError
from fedclust.core.registry import ALGORITHMS, DATA_SOURCES
from fedclust.privacy import DifferentialPrivacy
from fedclust.sim.partition import PARTITION_OPTIONS


def _run_help(capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _tables(text: str) -> dict[str, list[str]]:
    """The help's lines per ``[table]`` heading (the lines before the first: "top")."""
    tables: dict[str, list[str]] = {"top": []}
    current = "top"
    for line in text.split("a configuration is a TOML file", 1)[1].splitlines():
        head = re.match(r"^\[(\w+)\]", line)
        if head:
            current = head[1]
            tables[current] = []
        tables[current].append(line)
    return tables


def _assigned(lines: list[str]) -> set[str]:
    """``key = ...`` entries (the fixed tables)."""
    return {m[1] for line in lines for m in [re.match(r"^\s*(\w+) = ", line)] if m}


def _per_kind(lines: list[str]) -> dict[str, set[str]]:
    """``kind: key, key*, ...`` entries, wrapped lines joined (data, partition, algorithm)."""
    out: dict[str, set[str]] = {}
    kind = None
    for line in lines[1:]:
        m = re.match(r"^    ([\w-]+)(?: \([^)]*\))?: (.*)$", line)
        if m:
            kind, rest = m[1], m[2]
            out[kind] = set()
        elif kind is not None and line.startswith("        "):
            rest = line
        else:
            kind = None
            continue
        if rest.strip() != "(no other keys)":
            out[kind] |= {k.strip().rstrip("*") for k in rest.split(",") if k.strip()}
    return out


BASE = {"data": {"source": "gaussians"}, "algorithm": {"name": "distributed-lloyd",
                                                      "n_clusters": 2}}
#: a value each key of a fixed table takes, so the probe below fails only on what it tests
VALUES = {"dropout": 0.1, "late": 0.1, "byzantine": 0.1, "attack": "sign-flip",
          "attack_scale": 2.0, "secure_aggregation": True, "progress": True,
          "impute": "mean", "scale": "none", "bounds": [[0, 1]], "budget_share": 0.5,
          "site_rows": 10, "epsilon": 1.0, "delta": 1e-6, "unit": "point",
          "data_bound": 1.0, "clip_norm": 1.0, "noise_seed": 0, "accountant": "pld",
          "prior": "[]"}


def _refused_as_unknown(table: str, key: str) -> bool:
    cfg = dict(BASE)
    if table == "simulation":
        cfg[table] = {key: VALUES.get(key, 0), **({"byzantine": 0.1} if key.startswith("attack") else {})}
    elif table == "preprocess":
        cfg[table] = {key: VALUES.get(key, 0)}
        cfg["privacy"] = {"epsilon": 1.0, "delta": 1e-6, "data_bound": 1.0}
    else:
        cfg[table] = {"epsilon": 1.0, "delta": 1e-6, key: VALUES.get(key, 0)}
    try:
        check_config(cfg)
    except ConfigError as exc:
        return "unknown" in str(exc)
    return False


def test_run_help_lists_preprocess_privacy_and_secure_aggregation(capsys):
    tables = _tables(_run_help(capsys))
    assert {"data", "partition", "algorithm", "simulation", "baselines", "preprocess",
            "privacy"} <= set(tables)
    assert "secure_aggregation" in _assigned(tables["simulation"])
    assert {"impute", "scale", "bounds", "budget_share", "site_rows"} == _assigned(
        tables["preprocess"])
    # [privacy]: the fields of DifferentialPrivacy, found independently of the help's source
    assert _assigned(tables["privacy"]) == {f.name for f in fields(DifferentialPrivacy)}
    assert set(inspect.signature(DifferentialPrivacy).parameters) == _assigned(tables["privacy"])
    assert {"seed", "title"} <= _assigned(tables["top"])


@pytest.mark.parametrize("table", ["simulation", "preprocess", "privacy"])
def test_fixed_tables_list_exactly_the_keys_the_check_accepts(capsys, table):
    listed = _assigned(_tables(_run_help(capsys))[table])
    check_config(BASE)  # valid: a probe's error comes from the key it adds
    assert listed and all(not _refused_as_unknown(table, key) for key in listed)
    # the probe can tell: a key outside the list is refused as unknown
    assert _refused_as_unknown(table, "not_a_key")
    accepted = {key for key in VALUES if not _refused_as_unknown(table, key)}
    assert accepted == listed


def test_every_top_level_key_is_listed(capsys):
    tables = _tables(_run_help(capsys))
    listed = set(tables) - {"top"} | _assigned(tables["top"])
    # a top-level key outside the help is refused as unknown; every listed one is not
    with pytest.raises(ConfigError, match="unknown top-level keys") as exc:
        check_config({**BASE, "not_a_key": 1})
    allowed = set(re.search(r"allowed: \[(.*)\]", str(exc.value))[1].replace("'", "").split(", "))
    assert allowed == listed


def test_every_source_kind_and_algorithm_is_listed_with_its_keys(capsys):
    tables = _tables(_run_help(capsys))
    data = _per_kind(tables["data"])
    assert set(data) == set(DATA_SOURCES)
    for source in DATA_SOURCES:
        assert data[source] == data_keys(source), source
    part = _per_kind(tables["partition"])
    assert set(part) == set(PARTITION_OPTIONS)
    for kind in PARTITION_OPTIONS:
        assert part[kind] == partition_keys(kind) - {"n_devices"}, kind
    algo = _per_kind(tables["algorithm"])
    assert set(algo) == set(ALGORITHMS)
    for name in ALGORITHMS:
        assert algo[name] == algorithm_keys(name), name
    base = _per_kind(tables["baselines"])
    assert base == {name: set(a.baselines) for name, a in ALGORITHMS.items() if a.baselines}
