"""One Flower simulation smoke run (Ray, in a subprocess): `fedclust run --transport flower`
gives the same result.json as `--transport inprocess` (≈15 s)."""

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
[simulation]
dropout = 0.1
late = 0.2
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
    assert a["communication"] == b["communication"]
    assert a["metrics"] == b["metrics"]  # device labels, late devices included
