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
from fedclust.privacy import DifferentialPrivacy, composed_epsilon


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
    assert all(h["train_loss"] is None for h in m.history_)  # losses are not released


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


def test_subsampled_rounds_are_amplified_as_dp_accounting_computes():
    """m of N devices a round (secret Poisson sample): the accountant's sampled event.

    Same noise multiplier: ε with sampling q is smaller than with full participation and
    equals dp-accounting's own PoissonSampledDpEvent composition."""
    import dp_accounting
    from dp_accounting import pld

    Xs, ys = federation(Z=40)
    dp = DifferentialPrivacy(2.0, 1e-5, unit="device", clip_norm=0.5, noise_seed=0)
    m = FedAvg("logistic", rounds=6, lr=0.5, clients_per_round=8, privacy=dp,
               random_state=0).fit(Xs, ys)
    rel = m.privacy_["releases"][0]
    assert rel["sampling"] == pytest.approx(0.2)
    z = rel["noise_multiplier"]
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(z)), 6))
    assert acc.get_epsilon(1e-5) == pytest.approx(m.privacy_["epsilon_spent"], rel=1e-9)
    assert m.privacy_["epsilon_spent"] <= 2.0
    full = composed_epsilon([(z, 6)], 1e-5)
    assert full > 1.5 * m.privacy_["epsilon_spent"]          # amplification
    # the same budget without sampling needs more noise
    full_fit = FedAvg("logistic", rounds=6, lr=0.5, privacy=dp, random_state=0).fit(Xs, ys)
    assert full_fit.privacy_["releases"][0]["noise_multiplier"] > 2 * z


def test_poisson_sample_is_secret_and_about_the_right_size():
    """The sample comes from the privacy-noise stream, not from random_state: two OS-noise
    fits with the same random_state pick different devices; with a noise_seed the pick is
    reproducible; the number of devices a round is Binomial(N, q)."""
    Xs, ys = federation(Z=40)
    kw = dict(rounds=30, lr=0.5, clients_per_round=10, random_state=0)
    seeded = DifferentialPrivacy(8.0, 1e-5, unit="device", clip_norm=0.5, noise_seed=3)
    a = FedAvg("logistic", privacy=seeded, **kw).fit(Xs, ys)
    b = FedAvg("logistic", privacy=seeded, **kw).fit(Xs, ys)
    dev = [h["devices"] for h in a.history_]
    assert dev == [h["devices"] for h in b.history_]
    assert 0.25 * 0.8 < np.mean(dev) / 40 < 0.25 * 1.2 and len(set(dev)) > 3
    os_dp = DifferentialPrivacy(8.0, 1e-5, unit="device", clip_norm=0.5)
    c = FedAvg("logistic", privacy=os_dp, **kw).fit(Xs, ys)
    assert [h["devices"] for h in c.history_] != dev


def test_empty_poisson_sample_still_releases_noise():
    dp = DifferentialPrivacy(1.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=0)
    proto = FedAvgProtocol(model="linear", n_features=2, n_classes=1, privacy=dp,
                           clients_per_round=1, sampling=1e-9, rounds=2)
    calls = []
    real = proto._aggregate
    proto._aggregate = lambda replies, prev, key: calls.append(len(replies)) or real(
        replies, prev, key)
    state = proto.start([0, 1, 2], 0)
    assert proto.next_request(state) is None       # nobody sampled in either round
    assert calls == [0, 0]                         # ... and both rounds were still noised
