"""The robust family through the registry: data source, config run, demo, the example."""

import json
from pathlib import Path

from fedclust.cli import main
from fedclust.config import load_config
from fedclust.experiment import build_federation, build_protocol

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "robust_regression.toml"


def test_demo_robust_recovers_the_regressions(tmp_path):
    assert main(["demo", "robust", "--out", str(tmp_path), "--no-plot"]) == 0
    res = json.loads((tmp_path / "result.json").read_text())
    m = res["metrics"]
    assert m["estimation_error"] < 0.2 and m["misclustering"] <= 0.02
    assert m["byzantine_flagged"] > 0.9
    assert res["communication"]["rounds"] == 1 + 20   # one stage-3 round for all clusters
    assert len(res["device_clusters"]) == 100


def test_example_config_builds_the_protocol():
    cfg = load_config(EXAMPLE)
    fed = build_federation(cfg)
    assert len(fed.devices) == 200 and len(fed.extra["byzantine"]) == 30
    proto, devices, seed = build_protocol(cfg, fed)
    assert proto.name == "robust-regression" and proto.supervised
    assert len(devices) == 200 and isinstance(devices[0], tuple) and seed == 0
    assert type(proto).from_config(proto.config()).config() == proto.config()


def test_classification_example_runs_from_the_cli(tmp_path):
    example = EXAMPLE.parent / "robust_classification.toml"
    assert main(["run", str(example), "--out", str(tmp_path), "--no-plot"]) == 0
    res = json.loads((tmp_path / "result.json").read_text())
    m = res["metrics"]
    assert m["estimation_error"] < 0.3 and m["misclustering"] <= 0.03
    assert m["byzantine_flagged"] > 0.9 and 0.8 < m["test_accuracy"] <= 1.0
    assert res["communication"]["rounds"] == 1 + 40
    cfg = load_config(example)
    proto, _, _ = build_protocol(cfg, build_federation(cfg))
    assert proto.name == "robust-regression" and proto.config()["loss"] == "logistic"
    assert type(proto).from_config(proto.config()).config() == proto.config()


def test_classification_demo_is_the_example(tmp_path):
    example = EXAMPLE.parent / "robust_classification.toml"
    assert main(["demo", "robust-classification", "--out", str(tmp_path / "d"), "--no-plot"]) == 0
    assert main(["run", str(example), "--out", str(tmp_path / "e"), "--no-plot"]) == 0
    d, e = (json.loads((tmp_path / x / "result.json").read_text()) for x in "de")
    assert d["metrics"] == e["metrics"] and d["device_clusters"] == e["device_clusters"]
