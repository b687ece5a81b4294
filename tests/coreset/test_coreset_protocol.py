"""The star protocol: same result on Flower, tampered messages, bad input, registry/CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedclust import DistributedKMeans, DistributedPCA, ValidationError
from fedclust.core.messages import load_message, save_message
from fedclust.core.registry import protocol_from_config
from fedclust.coreset.messages import Budget, CoresetPortion, LocalCost, LocalSpectrum, PointSum
from fedclust.coreset.protocol import CoresetProtocol
from fedclust.sim.transport import InProcessTransport


@pytest.fixture(scope="module")
def devices():
    rng = np.random.default_rng(2)
    means = 5.0 * rng.standard_normal((4, 12))
    return [means[rng.integers(0, 4, n)] + rng.standard_normal((n, 12))
            for n in (80, 120, 60, 150, 90)]


def test_same_result_on_flower(devices):
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    for kw in ({"n_components": 4}, {"method": "combine"}):
        a = DistributedKMeans(4, 150, random_state=5, **kw).fit(devices)
        b = DistributedKMeans(4, 150, random_state=5, **kw).fit(
            devices, transport=FlowerInMemoryTransport())
        np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
        np.testing.assert_array_equal(a.coreset_[0], b.coreset_[0])
        for la, lb in zip(a.device_labels_, b.device_labels_):
            np.testing.assert_array_equal(la, lb)
        assert a.communication_["bytes_up"] == b.communication_["bytes_up"]
    p = DistributedPCA(3, random_state=0).fit(devices, transport=FlowerInMemoryTransport())
    q = DistributedPCA(3, random_state=0).fit(devices)
    np.testing.assert_array_equal(p.components_, q.components_)


def test_config_round_trip_and_codec():
    proto = CoresetProtocol(5, 300, n_components=7, method="combine", n_features=20)
    again = protocol_from_config("coreset", proto.config())
    assert again.config() == proto.config()
    assert protocol_from_config("coreset", CoresetProtocol(3, 10).config()).n_components is None
    msgs = [PointSum(np.arange(3.0), np.asarray(4)),
            LocalSpectrum(np.array([3.0, 1.0]), np.eye(2, 3)),
            LocalCost(np.asarray(2.5), np.asarray(7)),
            CoresetPortion(np.ones((3, 2)), np.array([2.0, 3.0, -1.0]), np.asarray(4)),
            Budget(np.asarray(1.0), np.asarray(5), np.asarray(10), np.asarray(2))]
    for m in msgs:
        back = type(m).from_arrays(m.to_arrays())
        for name, arr in m.to_arrays().items():
            again = back.to_arrays()[name]
            assert np.array_equal(arr, again) and arr.dtype == again.dtype


def test_codec_file_round_trip(tmp_path):
    m = CoresetPortion(np.random.default_rng(0).standard_normal((4, 3)), np.ones(4), np.asarray(4))
    save_message(m, tmp_path / "p.npz")
    back = load_message(tmp_path / "p.npz")
    assert np.array_equal(back.points, m.points) and back.kind == "coreset_portion"


@pytest.mark.parametrize("field,value,match", [
    ("n_points", np.asarray(-3), "n_points=-3 must be >= 0"),
    ("weights", "nan", "non-finite"),
    ("points", "wide", "columns, expected"),
    ("weights", "shift", "weights add up to"),
    ("cost", np.asarray(-1.0), "cost=-1.0 must be >= 0"),
])
def test_tampered_messages_rejected_by_name(devices, field, value, match):
    def tamper(z, rnd, arrays):
        if z != 2 or field not in arrays:
            return arrays
        a = dict(arrays)
        if isinstance(value, str):
            if value == "nan":
                a[field] = np.full_like(a[field], np.nan)
            elif value == "wide":
                a[field] = np.concatenate([a[field], a[field][:, :1]], axis=1)
            else:
                a[field] = a[field] + 1.0
        else:
            a[field] = value
        return a

    km = DistributedKMeans(4, 150, random_state=1).fit(
        devices, transport=InProcessTransport(tamper=tamper))
    assert 2 in km.run_log_.rejected
    assert "device 2" in km.run_log_.rejected[2] and match in km.run_log_.rejected[2]
    assert km.device_labels_[2] is not None   # it still receives the final centers
    assert 2 not in set(km.coreset_owner_.tolist())
    assert km.cluster_centers_.shape == (4, 12)


def test_oversized_portion_and_lying_count_rejected(devices):
    def tamper(z, rnd, arrays):
        if z == 1 and "points" in arrays:    # 10x its budget, weights still adding up
            reps = 10
            return {"points": np.repeat(arrays["points"], reps, axis=0),
                    "weights": np.repeat(arrays["weights"], reps) / reps,
                    "n_points": arrays["n_points"]}
        if z == 3 and "cost" in arrays:
            return dict(arrays, n_points=np.asarray(999))   # not what it said in the means round
        return arrays

    km = DistributedKMeans(4, 100, n_components=3, random_state=0).fit(
        devices, transport=InProcessTransport(tamper=tamper))
    assert "more than its budget" in km.run_log_.rejected[1]
    assert "n_points=999 but it reported 150" in km.run_log_.rejected[3]


def test_bad_input(devices):
    with pytest.raises(ValidationError, match="coreset_size=3 must be >= n_clusters=4"):
        DistributedKMeans(4, 3).fit(devices)
    with pytest.raises(ValidationError, match="n_components=0 must be >= 1"):
        DistributedKMeans(4, 100, n_components=0).fit(devices)
    with pytest.raises(ValidationError, match="n_components=0 must be >= 1"):
        DistributedPCA(0).fit(devices)
    bad = [d.copy() for d in devices]
    bad[3][5, 2] = np.nan
    with pytest.raises(ValidationError, match="device 3 contains a non-finite"):
        DistributedKMeans(4, 100).fit(bad)
    with pytest.raises(ValidationError, match="device 1 has 5 features but device 0 has 12"):
        DistributedKMeans(4, 100).fit([devices[0], np.ones((4, 5))])
    with pytest.raises(ValidationError, match="device 1 has dtype <U1"):
        DistributedKMeans(4, 100).fit([devices[0], np.full((4, 12), "a")])
    with pytest.raises(ValidationError, match="all 3 devices are empty"):
        DistributedKMeans(2, 100).fit([np.zeros((0, 3))] * 3)
    with pytest.raises(ValidationError, match="method='kmedian'"):
        DistributedKMeans(4, 100, method="kmedian").fit(devices)
    with pytest.raises(ValidationError, match="has 3 points for n_clusters=4"):
        DistributedKMeans(4, 100).fit([np.ones((2, 3)), np.ones((1, 3))])
    km = DistributedKMeans(4, 100, random_state=0).fit(devices)
    with pytest.raises(ValidationError, match="X has 3 features"):
        km.predict(np.ones((2, 3)))


def test_cli_demo_and_registry(tmp_path):
    from fedclust.cli import main
    from fedclust.core.registry import ALGORITHMS, DATA_SOURCES, DEMOS, estimator_params

    assert "coreset" in ALGORITHMS and "coreset" in DEMOS and "low-rank-mixture" in DATA_SOURCES
    assert {"coreset_size", "n_components", "graph", "method"} <= set(
        estimator_params(ALGORITHMS["coreset"]))
    assert main(["demo", "coreset", "--out", str(tmp_path / "demo"), "--no-plot"]) == 0
    doc = json.loads((tmp_path / "demo" / "result.json").read_text())
    assert doc["algorithm"] == "coreset"
    assert doc["metrics"]["cost_ratio_vs_centralized"] < 1.1
    assert doc["communication"]["words_total"] * 8 == doc["communication"]["bytes_total"]


def test_example_config_on_a_graph(tmp_path):
    from pathlib import Path

    from fedclust.config import load_config
    from fedclust.experiment import run_experiment

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "coreset_lowrank.toml")
    cfg["data"].update(n_points=600, n_features=60)
    cfg["algorithm"].update(coreset_size=300)
    cfg["baselines"] = {"centralized": True}
    out = run_experiment(cfg).result
    assert out["communication"]["topology"] == "graph"
    assert out["communication"]["max_crossings_per_message"] <= 2
    assert out["metrics"]["cost_ratio_vs_centralized"] < 1.2
