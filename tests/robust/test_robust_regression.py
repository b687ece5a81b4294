"""The three-stage robust clustered regression: ERMs, clustering, robust rounds, transports."""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression as SkLinear, Ridge

from fedclust import RobustClusteredRegression, ValidationError
from fedclust.fl.models import LinearRegression
from fedclust.core.robust import trimmed_mean
from fedclust.robust import estimation_error, make_mixture_regression, misclustering_rate
from fedclust.robust.local import local_erm
from fedclust.sim.byzantine import ByzantineTamper
from fedclust.sim.transport import InProcessTransport


@pytest.fixture(scope="module")
def mix():
    return make_mixture_regression(60, 30, 5, 3, alpha=0.2, noise=0.3, random_state=1)


def _err(r, mr):
    return estimation_error(np.hstack([r.coef_, r.intercept_[:, None]]),
                            np.hstack([mr.coef, mr.intercept[:, None]]))


def test_local_erm_matches_scikit_learn():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 4)), rng.normal(size=30)
    sk = SkLinear().fit(X, y)
    np.testing.assert_allclose(local_erm(X, y), np.r_[sk.coef_, sk.intercept_], atol=1e-10)
    rd = Ridge(alpha=0.3 * 30).fit(X, y)   # our loss is a mean: alpha = n * l2
    np.testing.assert_allclose(local_erm(X, y, l2=0.3), np.r_[rd.coef_, rd.intercept_], atol=1e-10)
    nb = SkLinear(fit_intercept=False).fit(X, y)
    np.testing.assert_allclose(local_erm(X, y, fit_intercept=False), np.r_[nb.coef_, 0.0],
                               atol=1e-10)
    # the ERM zeroes the FL model's gradient
    m = LinearRegression(4)
    m.set_params(local_erm(X, y))
    assert np.abs(m.gradient(X, y)).max() < 1e-10


def test_too_few_samples_says_so_and_l2_regularises():
    rng = np.random.default_rng(1)
    Xs = [rng.normal(size=(20, 6)) for _ in range(4)] + [rng.normal(size=(4, 6))]
    ys = [X @ np.ones(6) for X in Xs]
    with pytest.raises(ValidationError, match=r"machine 4 has n=4 samples .* at least 7"):
        RobustClusteredRegression(1).fit(Xs, ys)
    with pytest.raises(ValidationError, match="l2 > 0"):
        local_erm(Xs[4], ys[4], owner="machine 4")
    # l2 > 0: ridge regression, (1/2n)‖Xw + b − y‖² + (l2/2)‖w‖², i.e. scikit-learn's Ridge
    # with alpha = n·l2, even with fewer samples than features
    from sklearn.linear_model import Ridge
    for l2 in (1e-3, 0.5):
        wb = local_erm(Xs[4], ys[4], l2=l2, owner="machine 4")
        ref = Ridge(alpha=4 * l2).fit(Xs[4], ys[4])
        np.testing.assert_allclose(wb, np.r_[ref.coef_, ref.intercept_], rtol=1e-9, atol=1e-12)
    r = RobustClusteredRegression(1, l2=1e-3, rounds=2, random_state=0).fit(Xs, ys)
    assert r.coef_.shape == (1, 6)
    np.testing.assert_allclose(r.coef_[0], np.ones(6), atol=0.05)   # y = X·1, tiny shrinkage


@pytest.mark.parametrize("change,needle", [
    (lambda Xs, ys: (Xs[:2] + [Xs[2][:, :3]] + Xs[3:], ys), "machine 2 has d=3"),
    (lambda Xs, ys: (Xs[:1] + [np.zeros((0, 5))] + Xs[2:], ys[:1] + [np.zeros(0)] + ys[2:]),
     "machine 1 is empty"),
    (lambda Xs, ys: (Xs, ys[:3] + [ys[3][:-1]] + ys[4:]), "machine 3: X has 30 rows"),
    (lambda Xs, ys: (Xs[:5] + [np.where(Xs[5] > 1, np.nan, Xs[5])] + Xs[6:], ys),
     "machine 5: X contains a non-finite value"),
    (lambda Xs, ys: (Xs, ys[:1] + [np.full(30, np.inf)] + ys[2:]), "machine 1: y contains"),
    (lambda Xs, ys: (Xs, ys[:-1]), "one y per machine"),
])
def test_bad_input_names_the_machine(mix, change, needle):
    Xs, ys = change(list(mix.Xs), list(mix.ys))
    with pytest.raises(ValidationError, match=needle):
        RobustClusteredRegression(3).fit(Xs, ys)


@pytest.mark.parametrize("kw,needle", [
    ({"n_clusters": 61}, "larger than the number of machines"),
    ({"beta": 0.5}, "beta"), ({"clustering": "dbscan"}, "clustering"),
    ({"aggregator": "mode"}, "aggregator"), ({"optimizer": "adam"}, "optimizer"),
])
def test_bad_parameters(mix, kw, needle):
    with pytest.raises(ValidationError, match=needle):
        RobustClusteredRegression(**{"n_clusters": 3, **kw}).fit(mix.Xs, mix.ys)


def test_robust_pipeline_beats_non_robust(mix):
    robust = RobustClusteredRegression(3, beta=0.2, random_state=0).fit(mix.Xs, mix.ys)
    plain = RobustClusteredRegression(3, clustering="kmeans", aggregator="mean",
                                      random_state=0).fit(mix.Xs, mix.ys)
    assert _err(robust, mix) < 0.2 < 1.0 < _err(plain, mix)
    assert misclustering_rate(robust.device_clusters_, mix.clusters) <= 0.02
    byz = mix.clusters < 0
    assert (robust.device_clusters_[byz] == -1).all()
    log = robust.stage_log_
    assert log["erms"].shape == (60, 6) and log["round_loss"].shape == (20, 3)
    assert log["clustering_history"].shape[1] == 60
    for kind in ("kgeomedians", "edge-cutting"):
        r = RobustClusteredRegression(3, clustering=kind, beta=0.2, random_state=0).fit(
            mix.Xs, mix.ys)
        assert misclustering_rate(np.where(r.device_clusters_ < 0, -1, r.device_clusters_),
                                  mix.clusters) <= 0.02


def test_one_cluster_mean_gd_converges_to_pooled_least_squares():
    rng = np.random.default_rng(2)
    w = rng.normal(size=4)
    Xs = [rng.normal(size=(25, 4)) for _ in range(6)]
    ys = [X @ w + 0.5 + rng.normal(size=25) for X in Xs]
    r = RobustClusteredRegression(1, aggregator="mean", rounds=150, lr=0.5,
                                  random_state=0).fit(Xs, ys)
    sk = SkLinear().fit(np.vstack(Xs), np.concatenate(ys))
    np.testing.assert_allclose(r.coef_[0], sk.coef_, atol=1e-8)
    np.testing.assert_allclose(r.intercept_[0], sk.intercept_, atol=1e-8)
    # FedAvg with one full-batch local step and the mean is gradient descent with the mean
    # (with more local steps it drifts towards the machines' own optima)
    g = RobustClusteredRegression(1, aggregator="mean", rounds=5, lr=0.3,
                                  random_state=0).fit(Xs, ys)
    f = RobustClusteredRegression(1, optimizer="fedavg", aggregator="mean", rounds=5,
                                  lr=0.3, local_steps=1, random_state=0).fit(Xs, ys)
    np.testing.assert_allclose(f.coef_, g.coef_, atol=1e-12)


def test_one_gd_round_is_trimmed_mean_of_gradients(mix):
    r = RobustClusteredRegression(3, rounds=1, lr=0.2, beta=0.2, random_state=0).fit(
        mix.Xs, mix.ys)
    start = r.stage_log_["initial_coef"]
    model = LinearRegression(5)
    for j in range(3):
        members = np.flatnonzero(r.device_clusters_ == j)
        grads = []
        for i in members:
            model.set_params(start[j])
            grads.append(model.gradient(mix.Xs[i], mix.ys[i]))
        want = start[j] - 0.2 * trimmed_mean(np.array(grads), 0.2)
        np.testing.assert_allclose(np.r_[r.coef_[j], r.intercept_[j]], want, atol=1e-12)


def test_bytes_match_the_formula(mix):
    r = RobustClusteredRegression(3, rounds=4, beta=0.2, random_state=0).fit(mix.Xs, mix.ys)
    p = 6
    served = int((r.device_clusters_ >= 0).sum())
    c = r.communication_
    assert c["bytes_up"] == 60 * (8 * p + 8) + 4 * served * (8 * p + 24)
    # every stage-3 round and the final message: each machine only its own cluster's model
    assert c["bytes_down"] == 4 * served * (8 * p + 8) + served * (8 * p + 8)
    assert c["rounds"] == 1 + 4   # one round per iteration for all clusters, not c x rounds


def test_same_seed_same_result_and_machine_order_invariance(mix):
    a = RobustClusteredRegression(3, rounds=3, optimizer="fedavg", random_state=4).fit(
        mix.Xs, mix.ys)
    b = RobustClusteredRegression(3, rounds=3, optimizer="fedavg", random_state=4).fit(
        mix.Xs, mix.ys)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    perm = np.random.default_rng(0).permutation(60)
    c = RobustClusteredRegression(3, rounds=3, optimizer="fedavg", random_state=4).fit(
        [mix.Xs[i] for i in perm], [mix.ys[i] for i in perm], device_ids=perm.tolist())
    np.testing.assert_allclose(c.coef_, a.coef_, atol=1e-12)
    np.testing.assert_array_equal(c.device_clusters_, a.device_clusters_[perm])


@pytest.mark.parametrize("attack,scale", [("large-norm", 100.0), ("sign-flip", 3.0),
                                          ("scale", 50.0), ("collude", 30.0)])
def test_liars_on_the_wire_in_every_stage(attack, scale):
    mr = make_mixture_regression(60, 30, 5, 3, alpha=0.0, noise=0.3, random_state=2)
    t = ByzantineTamper(range(60), 0.15, 7, attack=attack, scale=scale)
    honest = np.array([z not in t.byzantine for z in range(60)])
    r = RobustClusteredRegression(3, beta=0.2, random_state=0).fit(
        mr.Xs, mr.ys, transport=InProcessTransport(tamper=t))
    assert r.run_log_.rejected == {}
    assert _err(r, mr) < 0.25
    truth = np.where(honest, mr.clusters, -1)
    assert misclustering_rate(r.device_clusters_, truth) <= 0.02
    plain = RobustClusteredRegression(3, clustering="kmeans", aggregator="mean",
                                      random_state=0).fit(mr.Xs, mr.ys,
                                                          transport=InProcessTransport(tamper=t))
    assert _err(plain, mr) > 2 * _err(r, mr)


def test_predict_device(mix):
    r = RobustClusteredRegression(3, beta=0.2, random_state=0).fit(mix.Xs, mix.ys)
    i = int(np.flatnonzero(mix.clusters >= 0)[0])
    j = r.device_clusters_[i]
    X = mix.Xs[i][:5]
    np.testing.assert_allclose(r.predict_device(i, X), X @ r.coef_[j] + r.intercept_[j])
    b = int(np.flatnonzero(r.device_clusters_ == -1)[0])
    assert 0 <= r.device_model(b) < 3
    with pytest.raises(ValidationError):
        r.predict_device(i, np.ones((2, 4)))


def test_same_result_on_flower_in_memory(mix):
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    Xs, ys = mix.Xs[:24], mix.ys[:24]
    t = ByzantineTamper(range(24), 0.2, 3, attack="sign-flip", scale=5.0)
    a = RobustClusteredRegression(2, rounds=2, beta=0.25, random_state=1).fit(
        Xs, ys, transport=InProcessTransport(tamper=t))
    b = RobustClusteredRegression(2, rounds=2, beta=0.25, random_state=1).fit(
        Xs, ys, transport=FlowerInMemoryTransport(tamper=t))
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.device_clusters_, b.device_clusters_)
    assert a.communication_["bytes_up"] == b.communication_["bytes_up"]
