"""What a private fit releases: no exact per-device values, public label sets,
sampling the server cannot see (epsilon_spent always a number)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedclust import FedAvg, FedGaussClassifier, IFCA
from fedclust.core.exceptions import ValidationError
from fedclust.privacy import DifferentialPrivacy, composed_epsilon


def _fl_federation(Z=12, n=20, d=4, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    Xs = [rng.standard_normal((n, d)) for _ in range(Z)]
    return Xs, [(X @ w > 0).astype(int) for X in Xs]




def test_secure_sampled_dp_fedavg_asks_every_device_and_accounts_a_number():
    Xs, ys = _fl_federation()
    dp = DifferentialPrivacy(2.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=3)
    m = FedAvg("logistic", rounds=4, lr=0.5, clients_per_round=3, privacy=dp,
               secure_aggregation=True, random_state=0).fit(Xs, ys)
    spent = m.privacy_["epsilon_spent"]
    assert isinstance(spent, float) and math.isfinite(spent)
    rel = m.privacy_["releases"][0]
    # the devices' own coins keep the sample from the server: amplification holds and the
    # accountant's number is the Poisson-sampled composition of the calibrated multiplier
    assert rel["sampling"] == pytest.approx(3 / 12)
    assert spent == pytest.approx(composed_epsilon([(rel["noise_multiplier"], 4, 3 / 12)], 1e-5))
    assert spent <= 2.0
    # the server sent every round to all 12 devices: it cannot tell who was sampled
    assert [h["devices"] for h in m.history_] == [12] * 4


def test_device_coins_leave_unsampled_devices_out_of_the_sum():
    from fedclust.fl.protocol import FedAvgProtocol

    dp = DifferentialPrivacy(math.inf, 1e-5, unit="device", clip_norm=1.0, noise_seed=1)
    p = FedAvgProtocol(model="linear", n_features=2, n_classes=1, privacy=dp, sampling=0.3,
                       secure_sum=True, noise_devices=3)
    coins = [p._device_coin(z, r) for z in range(40) for r in range(10)]
    assert 0.2 < np.mean(coins) < 0.4   # Binomial(400, 0.3): 6 stds either side
    off = p._noisy_update(np.array([0.3, 0.4, 0.0]), 0, 0, sampled=False)
    on = p._noisy_update(np.array([0.3, 0.4, 0.0]), 0, 0, sampled=True)
    assert float(off.count) == 0.0 and np.all(off.delta == 0)
    assert float(on.count) == 1.0 and np.allclose(on.delta, [0.3, 0.4, 0.0])


def _blobs(seed=0, Z=3, n=60, d=2):
    rng = np.random.default_rng(seed)
    return [np.concatenate([rng.normal(0, 0.5, (n // 2, d)), rng.normal(4, 0.5, (n // 2, d))])
            for _ in range(Z)]


def _two_class_owners(seed=0, Z=4, n=240, d=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = rng.standard_normal((n, d)) + 3.0 * y[:, None]
    return np.array_split(X, Z), np.array_split(y, Z)


def test_private_gauss_classifier_releases_no_owner_counts(tmp_path):
    from fedclust.sim.transport import InProcessTransport
    from fedclust.flower.results import save_run_output

    Xs, ys = _two_class_owners()
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=6.0, noise_seed=0)
    m = FedGaussClassifier(privacy=dp, classes=[0, 1], random_state=0).fit(Xs, ys)
    assert m.local_counts_ == [None] * 4
    assert "clipped" not in m.privacy_
    # what the Flower server app writes (result.npz / result.json) comes from the same result
    out = InProcessTransport().run(m._protocol_, {z: (X, y) for z, (X, y) in
                                                  enumerate(zip(Xs, ys))}, 0)
    assert out.result.local_counts == {}
    npz = save_run_output(out, m._protocol_.name, tmp_path)
    with np.load(npz, allow_pickle=False) as f:
        assert not [k for k in f.files if k.startswith("result.local_counts")]


@pytest.mark.parametrize("family", ["lloyd", "kfed", "gauss-clustering", "preprocess"])
def test_no_clipping_counts_in_a_private_record(family):
    from fedclust import DistributedLloyd, FedGaussClustering, KFed
    from fedclust.sites.preprocess import FederatedPreprocessor

    devs = _blobs()
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=1.0, noise_seed=0)   # clips most points
    if family == "lloyd":
        m = DistributedLloyd(2, max_rounds=2, privacy=dp, random_state=0).fit(devs)
    elif family == "kfed":
        m = KFed(2, 2, privacy=dp, random_state=0).fit(devs)
    elif family == "gauss-clustering":
        m = FedGaussClustering(privacy=dp, random_state=0).fit(devs)
    else:
        m = FederatedPreprocessor(privacy=dp, bounds=[(-1, 1), (-1, 1)]).fit(devs)
    assert "clipped" not in m.privacy_

    def keys(obj):      # every key of the record, at any depth (descriptions may say "clipped")
        if isinstance(obj, dict):
            return set(obj) | set().union(*(keys(v) for v in obj.values()))
        if isinstance(obj, (list, tuple)):
            return set().union(*(keys(v) for v in obj))
        return set()

    assert not [k for k in keys(json.loads(json.dumps(m.privacy_, default=str)))
                if "clipped" in str(k)]


def test_private_ifca_releases_no_device_cluster_choices():
    Xs, ys = _fl_federation(seed=2)
    make = lambda dp: IFCA(2, "logistic", rounds=3, privacy=dp, random_state=0)  # noqa: E731
    plain = make(None).fit(Xs, ys)
    assert min(plain.device_clusters_) >= 0          # without privacy: every choice is known
    dp = DifferentialPrivacy(4.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=3)
    m = make(dp).fit(Xs, ys)
    assert m.device_clusters_ == [-1] * len(Xs)
    # each device still gets predictions, routed on its own points
    pred = m.predict_device(0, Xs[0])
    assert pred.shape == (len(Xs[0]),) and set(np.unique(pred)) <= {0, 1}


def test_private_multiclass_fedavg_needs_public_classes():
    rng = np.random.default_rng(4)
    Xs = [rng.standard_normal((15, 3)) for _ in range(4)]
    ys = [rng.integers(0, 3, 15) for _ in range(4)]
    dp = DifferentialPrivacy(2.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=0)
    with pytest.raises(ValidationError, match="needs classes="):
        FedAvg("softmax", rounds=1, privacy=dp).fit(Xs, ys)
    # one device with a label nobody else has would add a class: the public list decides
    m = FedAvg("softmax", rounds=1, privacy=dp, classes=5, random_state=0).fit(Xs, ys)
    assert list(m.classes_) == [0, 1, 2, 3, 4] and m.models_.shape[1] == 4 * 5
    m = FedAvg("softmax", rounds=1, privacy=dp, classes=[0, 1, 2, 3, 4], random_state=0).fit(
        Xs, ys)
    assert list(m.classes_) == [0, 1, 2, 3, 4]
    with pytest.raises(ValidationError, match="outside classes"):
        FedAvg("softmax", rounds=1, privacy=dp, classes=2).fit(Xs, ys)


def test_private_gauss_classifier_needs_public_classes():
    Xs, ys = _two_class_owners()
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=6.0, noise_seed=0)
    with pytest.raises(ValidationError, match=r"needs classes="):
        FedGaussClassifier(privacy=dp).fit(Xs, ys)
    # a label outside the public list is refused without showing it under privacy
    with pytest.raises(ValidationError, match=r"owner 0 holds a label outside") as err:
        FedGaussClassifier(privacy=dp, classes=[0]).fit(Xs, ys)
    assert "(1)" not in str(err.value)
    # the public list may hold a class no owner has; it is still a class of the model
    m = FedGaussClassifier(privacy=dp, classes=[0, 1, 2], random_state=0).fit(Xs, ys)
    assert list(m.classes_) == [0, 1, 2]
    plain = FedGaussClassifier(random_state=0).fit(Xs, ys)
    assert list(plain.classes_) == [0, 1]


def test_private_fl_result_and_replies_carry_no_device_sizes_or_choices():
    from fedclust.fl.protocol import FedAvgProtocol
    from fedclust.fl.messages import ModelUpdate
    from fedclust.sim.transport import InProcessTransport

    Xs, ys = _fl_federation(seed=3)
    dp = DifferentialPrivacy(4.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=1)
    m = IFCA(2, "logistic", rounds=2, privacy=dp, random_state=0).fit(Xs, ys)
    out = InProcessTransport().run(m._protocol_, {z: (X, y) for z, (X, y) in
                                                  enumerate(zip(Xs, ys))}, 0)
    # what the Flower server writes to result.npz: no per-device counts or choices
    assert out.result.local_counts == {} and out.result.center_labels == {}
    p = FedAvgProtocol(model="logistic", n_features=4, n_classes=2, privacy=dp)
    u = p._local(np.zeros(5), Xs[0], ys[0], 0, 0, 0)
    assert isinstance(u, ModelUpdate) and int(u.n_samples) == 1 and float(u.loss) == 0.0
