"""DP-FedAvg: clipping + noise on the server's sum, accounting, refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust import FedAvg, IFCA
from fedclust.core.exceptions import ValidationError
from fedclust.fl.estimator import ClusteredFedAvg
from fedclust.fl.messages import ModelUpdate
from fedclust.fl.protocol import FedAvgProtocol
from fedclust.privacy import DifferentialPrivacy


def federation(Z=20, n=30, d=5, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    Xs = [rng.standard_normal((n, d)) for _ in range(Z)]
    ys = [(X @ w > 0).astype(int) for X in Xs]
    return Xs, ys


def _update(params, cluster=0):
    return ModelUpdate(params=np.asarray(params, float), cluster=np.int64(cluster),
                       n_samples=np.int64(5), loss=np.float64(0.0))


def test_server_clips_each_update_and_averages_without_noise():
    dp = DifferentialPrivacy(math.inf, 1e-5, unit="device", clip_norm=1.0)
    proto = FedAvgProtocol(model="linear", n_features=2, n_classes=1, privacy=dp)
    prev = np.zeros((1, 3))
    replies = {0: _update([3.0, 4.0, 0.0]), 1: _update([0.0, 0.5, 0.0])}
    out = proto._aggregate(replies, prev, 0)
    # update 0 clipped to norm 1 -> (0.6, 0.8, 0); unweighted mean with update 1
    assert np.allclose(out[0], [0.3, 0.65, 0.0])


def test_noise_scale_and_budget():
    Xs, ys = federation()
    dp = DifferentialPrivacy(2.0, 1e-5, unit="device", clip_norm=0.5, noise_seed=0)
    m = FedAvg("logistic", rounds=4, lr=0.5, privacy=dp, random_state=0).fit(Xs, ys)
    rel = m.privacy_["releases"][0]
    assert rel["repeats"] == 4 and rel["sensitivity"] == pytest.approx(0.5 * math.sqrt(2))
    assert m.privacy_["epsilon_spent"] <= 2.0
    assert all(h["train_loss"] == 0 for h in m.history_)     # losses are not released


def test_infinite_epsilon_equal_sizes_matches_fedavg_closely():
    Xs, ys = federation(seed=1)
    a = FedAvg("logistic", rounds=5, lr=0.5, random_state=0).fit(Xs, ys)
    b = FedAvg("logistic", rounds=5, lr=0.5, random_state=0, privacy=DifferentialPrivacy(
        math.inf, 1e-5, unit="device", clip_norm=1e6)).fit(Xs, ys)
    # equal device sizes: the unweighted mean of updates is FedAvg's weighted mean
    assert np.allclose(a.models_, b.models_, atol=1e-10)


def test_ifca_private_runs_and_flower_config_round_trip():
    Xs, ys = federation(seed=2)
    dp = DifferentialPrivacy(4.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=3)
    m = IFCA(2, "logistic", rounds=3, privacy=dp, random_state=0).fit(Xs, ys)
    assert np.isfinite(m.models_).all()
    proto = m._protocol_
    again = type(proto).from_config(proto.config())
    assert again.plan.releases[0].noise_multiplier == proto.plan.releases[0].noise_multiplier
    assert again.privacy == dp


@pytest.mark.parametrize("make,text", [
    (lambda dp: FedAvg("logistic", privacy=dp), "unit='device'"),
    (lambda dp: FedAvg("logistic", aggregator="median", privacy=dp.__class__(
        1.0, 1e-5, unit="device", clip_norm=1.0)), "aggregator='median' has no DP"),
    (lambda dp: IFCA(2, "logistic", n_init=3, privacy=dp.__class__(
        1.0, 1e-5, unit="device", clip_norm=1.0)), "n_init=3 picks a start"),
    (lambda dp: ClusteredFedAvg(2, model="logistic", privacy=dp.__class__(
        1.0, 1e-5, unit="device", clip_norm=1.0)), "k-FED round has no device-level DP"),
    (lambda dp: FedAvg("logistic", privacy=dp.__class__(1.0, 1e-5, unit="device")),
     "needs clip_norm"),
])
def test_refusals(make, text):
    Xs, ys = federation(seed=4)
    dp = DifferentialPrivacy(1.0, 1e-5, unit="point", data_bound=1.0)
    with pytest.raises(ValidationError) as exc:
        make(dp).fit(Xs, ys)
    assert text in str(exc.value) and "\n" not in str(exc.value)
