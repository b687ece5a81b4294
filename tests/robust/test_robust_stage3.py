"""Stage 3: batched rounds against a per-cluster reference, the adaptive trim fraction,
and the logistic counterpart of the pipeline."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression as SkLogistic

from fedclust import ValidationError
from fedclust.core.robust import trimmed_mean
from fedclust.fl.models import LinearRegression, LogisticRegression
from fedclust.robust import (RobustClusteredClassification, RobustClusteredRegression,
                             estimation_error, make_mixture_regression, misclustering_rate)
from fedclust.robust.local import local_logistic_erm
from fedclust.robust.server import adaptive_beta, outlier_share
from fedclust.sim.byzantine import ByzantineTamper
from fedclust.sim.transport import InProcessTransport


@pytest.fixture(scope="module")
def mix():
    return make_mixture_regression(60, 30, 5, 3, alpha=0.2, noise=0.3, random_state=1)


def _stage3_reference(r, Xs, ys, rounds, lr, beta, model):
    """Per-cluster, per-round GD with the trimmed mean, computed here from the stage-2 outcome
    (the old one-round-per-(round, cluster) schedule, written independently)."""
    W = r.stage_log_["initial_coef"].copy()
    for _ in range(rounds):
        for j in range(W.shape[0]):
            members = np.flatnonzero(r.device_clusters_ == j)
            grads = []
            for i in members:
                model.set_params(W[j])
                grads.append(model.gradient(Xs[i], ys[i]))
            W[j] = W[j] - lr * trimmed_mean(np.array(grads), beta)
    return W


def test_batched_stage3_equals_per_cluster_rounds(mix):
    r = RobustClusteredRegression(3, rounds=6, lr=0.2, beta=0.2, adaptive_beta=False,
                                  random_state=0).fit(mix.Xs, mix.ys)
    want = _stage3_reference(r, mix.Xs, mix.ys, 6, 0.2, 0.2, LinearRegression(5))
    np.testing.assert_allclose(np.hstack([r.coef_, r.intercept_[:, None]]), want, atol=1e-12)
    assert r.communication_["rounds"] == 1 + 6
    # honest clusters: nothing is flagged, the adaptive rule keeps beta and the same models
    a = RobustClusteredRegression(3, rounds=6, lr=0.2, beta=0.2, random_state=0).fit(
        mix.Xs, mix.ys)
    np.testing.assert_array_equal(a.coef_, r.coef_)
    assert np.all(a.stage_log_["round_beta"] == 0.2)


def test_dropped_machines_leave_the_others_unharmed(mix):
    t = InProcessTransport(dropout=0.3)
    r = RobustClusteredRegression(3, rounds=5, beta=0.2, random_state=0).fit(
        mix.Xs, mix.ys, transport=t)
    assert r.run_log_.failed == {} and r.run_log_.rejected == {}
    assert estimation_error(np.hstack([r.coef_, r.intercept_[:, None]]),
                            np.hstack([mix.coef, mix.intercept[:, None]])) < 0.3


def test_adaptive_beta_follows_the_outlier_share():
    rng = np.random.default_rng(0)
    honest = rng.normal(size=(14, 4))
    liars = 1e3 + rng.normal(size=(6, 4))        # 30% on one side, beyond beta = 0.1
    V = np.vstack([honest, liars])
    share, flagged = outlier_share(V)
    assert share == pytest.approx(0.3) and flagged[14:].all() and not flagged[:14].any()
    b = adaptive_beta(V, 0.1)
    assert int(np.floor(b * 20)) == 6
    # the trimmed mean at the adapted fraction drops every liar in every coordinate
    assert np.abs(trimmed_mean(V, b) - honest.mean(axis=0)).max() < 1.0
    assert np.abs(trimmed_mean(V, 0.1)).max() > 100      # the fixed beta is broken
    assert adaptive_beta(honest, 0.1) == 0.1              # nothing flagged: beta unchanged
    # the share never reaches 1/2
    assert adaptive_beta(np.vstack([honest[:11], liars + rng.normal(size=(6, 4)) * 1e3]),
                         0.1) < 0.5


def test_between_liars_gathering_in_one_cluster():
    """The liars of the 'between' attack sit next to two clusters and exceed beta there."""
    mr = make_mixture_regression(100, 50, 10, 4, alpha=0.0, noise=1.0, random_state=0)
    truth = np.hstack([mr.coef, mr.intercept[:, None]])
    t = ByzantineTamper(range(100), 0.2, 0, attack="between", between=(truth[0], truth[1]))
    kw = dict(beta=0.3, rounds=10, lr=0.1, random_state=0)
    fixed = RobustClusteredRegression(4, adaptive_beta=False, **kw).fit(
        mr.Xs, mr.ys, transport=InProcessTransport(tamper=t))
    adapt = RobustClusteredRegression(4, **kw).fit(mr.Xs, mr.ys,
                                                   transport=InProcessTransport(tamper=t))
    e_fixed = estimation_error(np.hstack([fixed.coef_, fixed.intercept_[:, None]]), truth)
    e_adapt = estimation_error(np.hstack([adapt.coef_, adapt.intercept_[:, None]]), truth)
    assert e_adapt < 0.5 * e_fixed
    assert np.nanmax(adapt.stage_log_["round_beta"]) > 0.3


# -- logistic ------------------------------------------------------------------------------
def test_logistic_erm_matches_scikit_learn():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    y = (X @ np.ones(4) + 2 * rng.normal(size=200) > 0).astype(float)
    sk = SkLogistic(C=1 / (0.01 * 200), tol=1e-12, max_iter=10000).fit(X, y)
    np.testing.assert_allclose(local_logistic_erm(X, y, l2=0.01),
                               np.r_[sk.coef_[0], sk.intercept_], atol=1e-6)
    m = LogisticRegression(4)
    m.set_params(local_logistic_erm(X, y))
    assert np.abs(m.gradient(X, y)).max() < 1e-7
    with pytest.raises(ValidationError, match="machine 3: its labels are linearly separable"):
        local_logistic_erm(X, (X[:, 0] > 0).astype(float), owner="machine 3")
    with pytest.raises(ValidationError, match="all one class"):
        local_logistic_erm(X, np.ones(200), owner="machine 3")


def _mixture_logistic(m=48, n=200, d=3, k=2, n_byz=8, seed=0):
    rng = np.random.default_rng(seed)
    W = np.array([[2.0, -2.0, 1.0, 0.5], [-2.0, 2.0, -1.0, -0.5]])[:k, :d + 1]
    Xs, ys, lab = [], [], []
    for i in range(m):
        X = rng.normal(size=(n, d))
        j = i % k
        w = W[j] if i >= n_byz else rng.normal(size=d + 1) * 8
        p = 1 / (1 + np.exp(-(X @ w[:-1] + w[-1])))
        Xs.append(X)
        ys.append((rng.uniform(size=n) < p).astype(np.int64))
        lab.append(j if i >= n_byz else -1)
    return Xs, ys, W, np.array(lab)


def test_robust_classification_recovers_the_models():
    Xs, ys, W, lab = _mixture_logistic()
    r = RobustClusteredClassification(2, l2=1e-3, rounds=30, lr=1.0, beta=0.2,
                                      random_state=0).fit(Xs, ys)
    est = np.hstack([r.coef_, r.intercept_[:, None]])
    assert misclustering_rate(r.device_clusters_, lab) <= 0.03
    assert estimation_error(est, W) < 0.8
    i = int(np.flatnonzero(lab >= 0)[0])
    pred = r.predict_device(i, Xs[i])
    assert set(np.unique(pred)) <= {0, 1} and np.mean(pred == ys[i]) > 0.7
    proba = r.predict_proba_device(i, Xs[i])
    assert proba.shape == (200,) and np.all((proba >= 0) & (proba <= 1))
    assert r.communication_["rounds"] == 1 + 30
    plain = RobustClusteredClassification(2, l2=1e-3, rounds=30, lr=1.0, clustering="kmeans",
                                          aggregator="mean", random_state=0).fit(Xs, ys)
    assert estimation_error(np.hstack([plain.coef_, plain.intercept_[:, None]]), W) > \
        estimation_error(est, W)
    with pytest.raises(ValidationError, match="outside the model's classes"):
        RobustClusteredClassification(2, l2=1e-3).fit(Xs, [y * 2 for y in ys])


def test_classification_same_result_on_flower_in_memory():
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    Xs, ys, _, _ = _mixture_logistic(m=16, n=40, n_byz=2, seed=1)
    kw = dict(l2=1e-2, rounds=2, lr=1.0, beta=0.2, random_state=1)
    a = RobustClusteredClassification(2, **kw).fit(Xs, ys)
    b = RobustClusteredClassification(2, **kw).fit(Xs, ys, transport=FlowerInMemoryTransport())
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert a.communication_ == b.communication_ or \
        a.communication_["bytes_up"] == b.communication_["bytes_up"]


def test_client_trains_the_model_it_is_sent(mix):
    from fedclust.core.protocol import Request
    from fedclust.robust.messages import ClusterParams
    from fedclust.robust.protocol import STEP, RobustRegressionProtocol

    proto = RobustRegressionProtocol(n_clusters=3, n_features=5, rounds=2)
    model = np.arange(6, dtype=np.float64) / 10
    req = Request(round=3, action=STEP, payload=ClusterParams(params=model, cluster=np.int64(2)))
    reply = proto.client_step(req, (mix.Xs[9], mix.ys[9]), device_id=9, seed=0, state={})
    m = LinearRegression(5)
    m.set_params(model)
    np.testing.assert_allclose(reply.params, model - 0.1 * m.gradient(mix.Xs[9], mix.ys[9]))
    assert int(reply.cluster) == 2
    with pytest.raises(ValidationError, match="machine 5: .* has d \\+ 1 = 6"):
        bad = ClusterParams(params=np.zeros(4), cluster=np.int64(0))
        proto.client_step(Request(round=4, action=STEP, payload=bad), (mix.Xs[5], mix.ys[5]),
                          device_id=5, seed=0, state={})


def test_run_log_names_the_distrusted_machines():
    """Stage-2 outliers and machines whose stage-3 updates are flagged in most rounds."""
    mr = make_mixture_regression(100, 50, 10, 4, alpha=0.0, noise=1.0, random_state=0)
    truth = np.hstack([mr.coef, mr.intercept[:, None]])
    t = ByzantineTamper(range(100), 0.2, 0, attack="between", between=(truth[0], truth[1]))
    r = RobustClusteredRegression(4, beta=0.3, rounds=10, random_state=0).fit(
        mr.Xs, mr.ys, transport=InProcessTransport(tamper=t))
    distrusted = set(r.run_log_.distrusted)
    assert distrusted <= set(t.byzantine)                 # no honest machine accused
    assert len(distrusted) >= 0.9 * len(t.byzantine)
    kept_liars = [z for z in t.byzantine if r.device_clusters_[z] >= 0]
    assert kept_liars and all("stage-3 rounds" in r.run_log_.distrusted[z]
                              for z in kept_liars if z in distrusted)
    clean = RobustClusteredRegression(4, beta=0.3, rounds=10, random_state=0).fit(mr.Xs, mr.ys)
    assert clean.run_log_.distrusted == {}


def test_off_axis_trimmed_mean_drops_a_tight_minority_inside_the_radius():
    # 90 honest rows N(0, I_10) and 14 rows tight around 5 units along one axis: inside the
    # cluster's radius (3 x the median norm, about 9), so the coordinate-wise trimmed mean
    # keeps most of their pull
    from fedclust.robust.server import off_axis_group, off_axis_trimmed_mean
    rng = np.random.default_rng(11)
    honest = rng.normal(size=(90, 10))
    u = rng.normal(size=10)
    u /= np.linalg.norm(u)
    V = np.vstack([honest, 5.0 * u + 0.1 * rng.normal(size=(14, 10))])
    agg, b, off = off_axis_trimmed_mean(V, 0.15)
    assert agg is not None and off[90:].all() and off[:90].sum() <= 2 and b >= 14 / 104
    coordinate = trimmed_mean(V, 0.15)
    # left along u: about the bias of dropping the lowest 14 honest rows (truncated normal,
    # 0.28); the coordinate-wise trimmed mean keeps more of the group's pull
    assert abs(agg @ u) < 0.45 < abs(coordinate @ u)
    # honest rows alone: no group, the coordinate-wise trimmed mean stays in charge
    basis, flagged = off_axis_group(honest)
    assert basis is None and not flagged.any()


def test_colluders_near_a_cluster_below_the_density_count():
    # 4 regressions in d = 8, 200 machines x 50 points; 8 colluders (4 %, fewer than the
    # density count n/(4k) = 12.5) hold data of their own around a point 3 ERM-noise spreads
    # from cluster 0's coefficients
    mr = make_mixture_regression(200, 50, 8, 4, alpha=0.0, noise=0.5, random_state=23)
    rng = np.random.default_rng(5)
    Xs, ys = list(mr.Xs), list(mr.ys)
    bad = rng.choice(np.flatnonzero(mr.clusters == 0), 8, replace=False)
    u = rng.normal(size=8)
    target = mr.coef[0] + 3 * 0.5 * np.sqrt(9 / 50) * u / np.linalg.norm(u)
    for i in bad:
        Xs[i] = rng.normal(size=(50, 8))
        ys[i] = Xs[i] @ target + 0.5 * rng.normal(size=50)
    truth = np.hstack([mr.coef, mr.intercept[:, None]])
    errs = {}
    for name, conf in (("plain", dict(clustering="kmeans", aggregator="mean")), ("robust", {})):
        est = RobustClusteredRegression(4, beta=0.15, rounds=10, random_state=3, **conf).fit(
            Xs, ys)
        errs[name] = estimation_error(np.hstack([est.coef_, est.intercept_[:, None]]), truth)
    clusters = mr.clusters.copy()
    clusters[bad] = -1
    assert misclustering_rate(est.device_clusters_, clusters) == 0.0
    assert errs["robust"] < 0.6 * errs["plain"], errs
