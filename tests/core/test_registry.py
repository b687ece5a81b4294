"""The registry: a family plugs in without touching config.py, experiment.py or cli.py."""

import inspect
import json

import numpy as np
import pytest

import fedclust
from fedclust import ConfigError, DistributedLloyd, KFed
from fedclust.cli import main
from fedclust.config import algorithm_keys, check_config
from fedclust.core import registry
from fedclust.clustering import clustering_report, plot_clustering
from fedclust.core.registry import (Algorithm, DataSource, Federation, estimator_params,
                                    register_algorithm, register_data_source, register_demo)
from fedclust.experiment import build_protocol
from fedclust.kfed import KFedProtocol
from fedclust.sim.faults import draw_faults
from fedclust.sim.transport import InProcessTransport


class _TwoStepLloyd(DistributedLloyd):
    """A toy 'family': distributed Lloyd with its own name and a required parameter."""

    def __init__(self, n_clusters=2, *, max_rounds=2, toy_knob=1.0, random_state=None,
                 progress=False):
        super().__init__(n_clusters, max_rounds=max_rounds, random_state=random_state,
                         progress=progress)
        self.toy_knob = toy_knob


def _line_source(seed, *, n_devices=4, n_per=30):
    rng = np.random.default_rng(seed)
    devices = [np.concatenate([rng.normal(-5, 0.1, (n_per, 2)), rng.normal(5, 0.1, (n_per, 2))])
               for _ in range(n_devices)]
    labels = [np.repeat([0, 1], n_per) for _ in range(n_devices)]
    return Federation(devices, labels, f"two blobs over {n_devices} devices")


@pytest.fixture
def toy_family():
    saved = {t: dict(getattr(registry, t)) for t in ("ALGORITHMS", "DATA_SOURCES", "DEMOS")}
    register_algorithm(Algorithm("toy-lloyd", _TwoStepLloyd, required=("toy_knob",),
                                 report=clustering_report, plot=plot_clustering,
                                 baselines=("centralized",)))
    register_data_source(DataSource("toy-blobs", _line_source, federated=True))
    register_demo("toy", {"seed": 1, "data": {"source": "toy-blobs", "n_devices": 3},
                          "algorithm": {"name": "toy-lloyd", "n_clusters": 2, "toy_knob": 2.0},
                          "baselines": {"centralized": True}})
    yield
    for t, v in saved.items():
        getattr(registry, t).clear()
        getattr(registry, t).update(v)


def test_allowed_keys_are_the_estimator_signature():
    params = inspect.signature(KFed.__init__).parameters
    expected = {p for p in params if p not in ("self", "random_state", "progress", "privacy")}
    assert algorithm_keys("kfed") == expected
    assert set(estimator_params(registry.ALGORITHMS["distributed-lloyd"])) == {
        "n_clusters", "points_per_device", "max_rounds", "tol", "init", "rounds",
        "secure_aggregation"}


def test_unknown_key_error_lists_the_valid_keys():
    cfg = {"data": {"source": "gaussians"},
           "algorithm": {"name": "kfed", "n_clusters": 2, "n_local_clusters": 1, "bogus": 3}}
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    text = str(err.value)
    assert "bogus" in text and "n_local_clusters" in text and "first_device" in text


def test_unknown_algorithm_and_source_name_the_registered_ones():
    with pytest.raises(ConfigError, match="kfed"):
        check_config({"data": {"source": "gaussians"}, "algorithm": {"name": "nope"}})
    with pytest.raises(ConfigError, match="gaussians"):
        check_config({"data": {"source": "nope"}, "algorithm": {"name": "kfed"}})


def test_a_new_family_is_served_by_run_and_demo(toy_family, tmp_path, capsys):
    cfg = tmp_path / "toy.toml"
    cfg.write_text('seed = 4\n[data]\nsource = "toy-blobs"\nn_devices = 5\n'
                   '[algorithm]\nname = "toy-lloyd"\nn_clusters = 2\ntoy_knob = 3.0\n'
                   '[baselines]\ncentralized = true\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    res = json.loads((tmp_path / "o" / "result.json").read_text())
    assert res["algorithm"] == "toy-lloyd" and res["n_devices"] == 5
    assert res["metrics"]["accuracy"] == 1.0
    assert res["metrics"]["cost_ratio_vs_centralized"] == pytest.approx(1.0, rel=1e-9)
    assert main(["demo", "toy", "--out", str(tmp_path / "d"), "--no-plot"]) == 0
    assert json.loads((tmp_path / "d" / "result.json").read_text())["n_devices"] == 3
    # required keys are enforced from the registration
    with pytest.raises(ConfigError, match="toy_knob"):
        check_config({"data": {"source": "toy-blobs"},
                      "algorithm": {"name": "toy-lloyd", "n_clusters": 2}})
    # baselines are limited to the ones the algorithm registers
    with pytest.raises(ConfigError, match="distributed_lloyd"):
        check_config({"data": {"source": "toy-blobs"}, "baselines": {"distributed_lloyd": True},
                      "algorithm": {"name": "toy-lloyd", "n_clusters": 2, "toy_knob": 1.0}})


def test_unknown_demo_is_a_one_line_error(capsys, tmp_path):
    assert main(["demo", "no-such-family", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no-such-family" in err and "kfed" in err


def test_build_protocol_is_what_the_estimator_runs():
    cfg = check_config({"seed": 5, "data": {"source": "gaussians", "n_features": 8,
                                            "n_clusters": 4, "n_local_clusters": 2, "m0": 2,
                                            "n_per_component": 10},
                        "algorithm": {"name": "kfed", "n_clusters": 4, "n_local_clusters": 2}})
    protocol, devices, seed = build_protocol(cfg)
    assert isinstance(protocol, KFedProtocol) and seed == 5
    out = InProcessTransport().run(protocol, devices, seed)
    from fedclust.experiment import build_federation
    model = KFed(4, 2, random_state=5).fit(build_federation(cfg).devices)
    np.testing.assert_array_equal(out.result.centers, model.cluster_centers_)


def test_draw_faults_is_seeded_and_disjoint():
    ids = list(range(40))
    a = draw_faults(ids, 7, dropout=0.25, late=0.25)
    assert a == draw_faults(list(reversed(ids)), 7, dropout=0.25, late=0.25)
    absent, late = a
    assert len(absent) == 10 and len(late) == 10 and not absent & late
    assert draw_faults(ids, 8, dropout=0.25)[0] != absent


def test_every_registered_protocol_rebuilds_from_its_config():
    for name, cls in registry.PROTOCOLS.items():
        assert cls.name == name
        assert all(a.isidentifier() for a in cls.reply_types)
    assert fedclust.KFed is KFed


def test_simulation_byzantine_keys_make_devices_lie_in_process(tmp_path):
    base = ('seed = 2\n[data]\nsource = "gaussians"\nn_features = 20\nn_clusters = 8\n'
            'n_local_clusters = 2\nm0 = 6\nn_per_component = 40\n'
            '[algorithm]\nname = "kfed"\nn_clusters = 8\nn_local_clusters = 2\n{trim}\n'
            '[simulation]\nbyzantine = 0.2\nattack = "large-norm"\nattack_scale = 1000.0\n')
    accs = {}
    for trim in ("", "trim = 0.2"):
        cfg = tmp_path / f"b{len(trim)}.toml"
        cfg.write_text(base.format(trim=trim))
        out = tmp_path / f"o{len(trim)}"
        assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
        res = json.loads((out / "result.json").read_text())
        assert len(res["byzantine"]) == round(0.2 * res["n_devices"])
        accs[trim] = res["metrics"]["accuracy"]
        if trim:
            assert sorted(int(z) for z in res["run_log"]["distrusted"]) == res["byzantine"]
    assert accs["trim = 0.2"] > accs[""]
    from fedclust.experiment import make_transport
    raw = {"data": {"source": "gaussians"}, "simulation": {"attack": "scale"},
           "algorithm": {"name": "kfed", "n_clusters": 2, "n_local_clusters": 1}}
    with pytest.raises(ConfigError, match=r"\[simulation\] attack/attack_scale need byzantine"):
        check_config(raw)
    with pytest.raises(ConfigError, match="byzantine"):
        make_transport({**raw, "seed": 0}, n_devices=4)
    cfg = check_config({**raw, "simulation": {}})
    cfg["simulation"] = {"byzantine": 0.25}
    # the same liars on both transports (the Flower clients rebuild the hook from its config)
    local, flower = make_transport(cfg, n_devices=8), make_transport(cfg, "flower", n_devices=8)
    assert flower.tamper.byzantine == local.tamper.byzantine and len(local.tamper.byzantine) == 2
