"""Flower simulation runs (Ray, in a subprocess): `fedclust run --transport flower` gives the
same result.json as `--transport inprocess` (≈15 s each), faults and Byzantine devices included."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from fedclust.cli import main  # noqa: E402

CONFIG = """
title = "flower smoke"
seed = 11
[data]
source = "gaussians"
n_features = 10
n_clusters = 8
n_local_clusters = 2
m0 = 3
separation = 60.0
n_per_component = 40
[algorithm]
name = "kfed"
n_clusters = 8
n_local_clusters = 2
trim = 0.2
[simulation]
dropout = 0.1
late = 0.2
byzantine = 0.2
attack = "large-norm"
attack_scale = 1000.0
[baselines]
centralized = false
distributed_lloyd = false
"""


@pytest.mark.slow
def test_simulation_matches_inprocess(tmp_path):
    cfg = tmp_path / "smoke.toml"
    cfg.write_text(CONFIG)
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-plot"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-plot",
                 "--transport", "flower"]) == 0
    a = json.loads((tmp_path / "a" / "result.json").read_text())
    b = json.loads((tmp_path / "b" / "result.json").read_text())
    assert b["transport"] == "flower"
    assert a["cluster_centers"] == b["cluster_centers"]
    assert a["run_log"] == b["run_log"]
    assert a["run_log"]["dropped"] and a["run_log"]["late"]
    assert a["byzantine"] == b["byzantine"] and a["byzantine"]  # the same liars, the same lies
    assert a["run_log"]["distrusted"]
    assert a["communication"] == b["communication"]
    assert a["metrics"] == b["metrics"]  # device labels, late devices included


_VOLATILE = {"transport", "time_s", "config"}


def _same(a, b, where=""):
    """Equal structure and integers/strings; floats to 1e-10 relative (BLAS rounding can
    differ in the last bits when a device's data is reloaded on a Flower node)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-10, abs=1e-12), where
    else:
        assert a == b, where


@pytest.mark.slow
@pytest.mark.parametrize("family", ["coreset", "gauss", "fl", "robust", "robust-classification"])
def test_every_family_demo_is_the_same_on_flower_simulation(family, tmp_path):
    """Each family's registered demo, with the same protocol object, on Flower's simulation
    engine (Ray, one virtual SuperNode per device) against the in-process transport."""
    from fedclust.config import check_config
    from fedclust.core.registry import DEMOS
    from fedclust.experiment import run_experiment

    cfg = check_config(dict(DEMOS[family], baselines={}), source=f"demo {family}")
    a = run_experiment(cfg, transport="inprocess").result
    b = run_experiment(cfg, transport="flower").result
    assert b["transport"] == "flower"
    assert set(a) == set(b)
    for key in set(a) - _VOLATILE:
        _same(a[key], b[key], key)
