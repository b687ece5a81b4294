"""The FL family through the registry: configs, the demo, build_protocol, the example."""

import json
from pathlib import Path

import pytest

from fedclust.cli import main
from fedclust.config import check_config
from fedclust.core.registry import DEMOS
from fedclust.experiment import build_protocol, run_experiment

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fl_rotated_digits.toml"


def _cfg(name, **algo):
    return {"seed": 0, "data": {"source": "rotated-images", "n_devices": 8, "n_train": 30,
                                "n_test": 10},
            "algorithm": {"name": name, "rounds": 2, "n_hidden": 8, **algo}}


@pytest.mark.parametrize("name,algo", [("fedavg", {}), ("ifca", {"n_clusters": 4}),
                                       ("clustered-fedavg", {"n_clusters": 4})])
def test_registered_algorithms_run_and_report_test_accuracy(name, algo):
    exp = run_experiment(check_config(_cfg(name, **algo)))
    m = exp.result["metrics"]
    assert 0.0 <= m["test_accuracy"] <= 1.0
    assert len(exp.result["history"]) == 2
    if name == "clustered-fedavg":
        assert m["cluster_accuracy"] == 1.0


def test_build_protocol_is_supervised_and_config_round_trips():
    proto, devices, seed = build_protocol(check_config(_cfg("clustered-fedavg", n_clusters=4)))
    assert proto.supervised and isinstance(devices[0], tuple)
    again = type(proto).from_config(proto.config())
    assert again.config() == proto.config()


def test_demo_runs_with_its_plots(tmp_path, capsys):
    assert "fl" in DEMOS
    assert main(["demo", "fl", "--out", str(tmp_path / "demo")]) == 0
    doc = json.loads((tmp_path / "demo" / "result.json").read_text())
    assert doc["algorithm"] == "clustered-fedavg" and doc["metrics"]["test_accuracy"] > 0.3


@pytest.mark.slow
def test_the_example_groups_devices_by_rotation(tmp_path):
    from sklearn.metrics import adjusted_rand_score

    assert main(["run", str(EXAMPLE), "--out", str(tmp_path / "ex"), "--no-plot"]) == 0
    doc = json.loads((tmp_path / "ex" / "result.json").read_text())
    clusters = doc["device_clusters"]
    # the rotated-images source deals the four rotations to the devices in turn
    assert adjusted_rand_score([z % 4 for z in range(len(clusters))], clusters) == 1.0
    assert doc["metrics"]["cluster_accuracy"] == 1.0
    assert doc["metrics"]["test_accuracy"] > 0.5      # ten classes: chance is 0.1


def test_unknown_algorithm_key_is_a_config_error():
    from fedclust import ConfigError

    with pytest.raises(ConfigError, match="n_clusterz"):
        check_config(_cfg("ifca", n_clusterz=3))
