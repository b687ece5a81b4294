"""DP federated Gaussian clustering: sensitivity, calibration, ε = ∞, transports, quality."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from fedclust import FedGaussClustering
from fedclust.core.exceptions import ValidationError
from fedclust.core.protocol import Request
from fedclust.gauss.private_clustering import GaussDPModel, PrivateGaussProtocol
from fedclust.privacy import DifferentialPrivacy, composed_epsilon

from scipy.optimize import brentq
from scipy.stats import norm


def analytic_multiplier(eps: float, delta: float) -> float:
    """Balle & Wang (2018), Thm 8: the exact multiplier of one Gaussian mechanism."""
    def excess(z):
        return (norm.cdf(-eps * z + 1 / (2 * z)) - math.exp(eps) * norm.cdf(-eps * z - 1 / (2 * z))
                - delta)
    return brentq(excess, 1e-2, 1e4, xtol=1e-10)


def owners(seed=5, n=3000, k=5, d=3, Z=4, std=1.0):
    X, y = make_blobs(n, n_features=d, centers=k, cluster_std=std, random_state=seed,
                      center_box=(-12, 12))
    return np.array_split(X, Z), X, y


def test_one_row_moves_the_release_by_at_most_sqrt3():
    """Add one row anywhere (inside or far outside the bound): the owner's message moves
    by a vector of norm <= √3 (count, whitened sum, upper triangle of Σ u uᵀ)."""
    rng = np.random.default_rng(0)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=5.0)
    p = PrivateGaussProtocol(privacy=dp, n_features=3)
    K = 4
    L = np.tril(rng.standard_normal((K, 3, 3))) + 2 * np.eye(3)
    model = GaussDPModel(means=rng.standard_normal((K, 3)), maps=L, log_weights=np.zeros(K))
    X = rng.standard_normal((50, 3)) * 3
    req = Request(2, "gauss_component_moments", payload=model)
    base = p.client_step(req, X, device_id=0, seed=0, state={})
    iu = np.triu_indices(3)
    worst = 0.0
    for row in np.vstack([rng.standard_normal((40, 3)) * s for s in (0.1, 3, 100)]):
        m = p.client_step(req, np.vstack([X, row]), device_id=0, seed=0, state={})
        dQ = (m.Q - base.Q).reshape(K, 3, 3)[:, iu[0], iu[1]]
        delta = np.concatenate([m.n - base.n, (m.s - base.s).ravel(), dQ.ravel()])
        worst = max(worst, float(np.linalg.norm(delta)))
    assert worst <= math.sqrt(3) + 1e-12
    assert worst > 1.2                          # far rows reach the clip (the bound is tight)
    assert p.plan.releases[0].sensitivity == math.sqrt(3)


def test_noise_multiplier_matches_the_analytic_gaussian():
    """T equal Gaussian releases with multiplier z compose exactly to one with z/√T
    (Gaussian DP); the accountant's calibration must sit within 1 % above Balle–Wang."""
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=5.0)
    p = PrivateGaussProtocol(privacy=dp, n_features=2, n_rounds=3)
    rel = p.plan.releases[0]
    assert rel.repeats == 5
    z_one = rel.noise_multiplier / math.sqrt(5)
    z_star = analytic_multiplier(1.0, 1e-6)
    assert z_star <= z_one <= 1.01 * z_star
    eps = composed_epsilon([(rel.noise_multiplier, 5)], 1e-6)
    assert 0.99 < eps <= 1.0
    assert rel.noise_std == pytest.approx(rel.noise_multiplier * math.sqrt(3))


def test_released_statistics_have_the_calibrated_variance():
    dp = DifferentialPrivacy(0.5, 1e-6, data_bound=5.0, noise_seed=0)
    p = PrivateGaussProtocol(privacy=dp, n_features=2)
    std = p.noise_std
    draws = []
    for i in range(3000):
        rng = np.random.default_rng(i)
        n, s, Q = p._noisy(np.zeros(2), np.zeros((2, 2)), np.zeros((2, 4)), rng)
        draws.append(np.concatenate([n, s.ravel(), Q.reshape(2, 4)[:, [0, 1, 3]].ravel()]))
    draws = np.array(draws)
    assert np.allclose(draws.std(axis=0), std, rtol=0.05)
    assert np.abs(draws.mean(axis=0)).max() < 0.1 * std
    Qfull = p._noisy(np.zeros(1), np.zeros((1, 2)), np.zeros((1, 4)), np.random.default_rng(1))[2]
    assert np.allclose(Qfull[0], Qfull[0].T)     # one draw per upper-triangle entry


def test_infinite_epsilon_releases_the_exact_statistics():
    """ε = ∞: the ball round gives the pooled mean and covariance exactly, and the fit
    equals the same procedure on the pooled rows (one owner) up to summation order."""
    Xs, X, y = owners()
    dp = DifferentialPrivacy(math.inf, 1e-6, data_bound=100.0)
    p = PrivateGaussProtocol(privacy=dp, n_features=3, n_rounds=2)
    state = p.start(range(len(Xs)), 0)
    req = p.next_request(state)
    replies = {z: p.client_step(req, Xz, device_id=z, seed=0, state={})
               for z, Xz in enumerate(Xs)}
    p.server_step(state, req, replies)
    N, mu, m2 = state.global_stats
    assert N == len(X)
    assert np.allclose(mu, X.mean(0)) and np.allclose(m2 / N, X.var(0))
    fed = FedGaussClustering(privacy=dp, n_rounds=2, random_state=0).fit(Xs)
    one = FedGaussClustering(privacy=dp, n_rounds=2, random_state=0).fit([X])
    assert fed.n_clusters_ == one.n_clusters_
    assert np.allclose(fed.means_, one.means_) and np.allclose(fed.scatters_, one.scatters_)
    assert fed.privacy_["releases"][0]["noise_multiplier"] == 0.0
    assert adjusted_rand_score(y, fed.labels_) > 0.95


def test_infinite_epsilon_is_the_noise_free_run_bit_for_bit():
    """ε = ∞ draws no noise at all: the same as any noise seed, and owner order is irrelevant."""
    Xs, _, _ = owners(seed=8, k=4)
    a = FedGaussClustering(privacy=DifferentialPrivacy(math.inf, 1e-6, data_bound=100.0),
                           random_state=2).fit(Xs)
    b = FedGaussClustering(privacy=DifferentialPrivacy(math.inf, 1e-6, data_bound=100.0,
                                                       noise_seed=4),
                           random_state=2).fit(Xs[::-1], device_ids=[3, 2, 1, 0])
    assert np.array_equal(a.means_, b.means_) and np.array_equal(a.scatters_, b.scatters_)


def test_private_fit_finds_the_clusters_and_records_the_budget():
    Xs, X, y = owners(seed=21, n=6000, k=6, d=2)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=20.0, noise_seed=3)
    m = FedGaussClustering(privacy=dp, random_state=0).fit(Xs)
    ref = FedGaussClustering().fit(Xs)             # non-private: two of the blobs overlap
    assert adjusted_rand_score(y, m.labels_) > adjusted_rand_score(y, ref.labels_) - 0.05 > 0.7
    assert 4 <= m.n_clusters_ <= 8                 # data-driven, no preset k
    rec = m.privacy_
    assert rec["epsilon_spent"] <= 2.0 and rec["releases"][0]["repeats"] == 5
    assert "clipped" not in rec
    for S in m.covariances_:
        assert np.linalg.eigvalsh(S).min() > 0


def test_noise_seed_reproduces_and_os_noise_differs():
    Xs, _, _ = owners(seed=2, n=1200, k=3)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=30.0, noise_seed=11)
    a = FedGaussClustering(privacy=dp, n_rounds=1, random_state=0).fit(Xs)
    b = FedGaussClustering(privacy=dp, n_rounds=1, random_state=0).fit(Xs)
    assert np.array_equal(a.means_, b.means_)
    os_dp = DifferentialPrivacy(1.0, 1e-6, data_bound=30.0)
    c = FedGaussClustering(privacy=os_dp, n_rounds=1, random_state=0).fit(Xs)
    assert c.means_.shape != a.means_.shape or not np.array_equal(a.means_, c.means_)


def test_flower_in_memory_transport_gives_the_same_noisy_fit():
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    Xs, _, _ = owners(seed=4, n=900, k=3, Z=3)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=30.0, noise_seed=5)
    a = FedGaussClustering(privacy=dp, n_rounds=2, random_state=1).fit(Xs)
    b = FedGaussClustering(privacy=dp, n_rounds=2, random_state=1).fit(
        Xs, transport=FlowerInMemoryTransport())
    assert np.array_equal(a.means_, b.means_) and np.array_equal(a.scatters_, b.scatters_)
    assert np.array_equal(np.concatenate(a.device_labels_), np.concatenate(b.device_labels_))


def test_secure_aggregation_gives_the_same_fit_from_the_sums_only():
    """The server only adds the owners' replies up: under secure aggregation it gets the sum
    (fixed point), and the fit is the same up to that rounding."""
    from fedclust.sim.transport import InProcessTransport

    Xs, _, _ = owners(seed=4, n=900, k=3, Z=4)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=30.0, noise_seed=5)
    a = FedGaussClustering(privacy=dp, n_rounds=2, random_state=1).fit(Xs)
    b = FedGaussClustering(privacy=dp, n_rounds=2, random_state=1).fit(
        Xs, transport=InProcessTransport(secure_aggregation=True))
    assert a.n_clusters_ == b.n_clusters_
    assert np.allclose(a.means_, b.means_, atol=1e-6)


def test_protocol_rebuilds_from_its_config_with_the_same_noise():
    dp = DifferentialPrivacy(0.7, 1e-6, data_bound=3.0, noise_seed=1, unit="device",
                             clip_norm=6.0)
    p = PrivateGaussProtocol(privacy=dp, n_features=4, covariance="diag")
    q = PrivateGaussProtocol.from_config(p.config())
    assert q.plan.releases[0].noise_multiplier == p.plan.releases[0].noise_multiplier
    assert p.plan.releases[0].sensitivity == pytest.approx(math.sqrt(3) * 2.0)
    assert q.diag and q.privacy == dp


def test_device_level_clips_each_owner_contribution():
    Xs, X, y = owners(seed=6, n=2000, k=3, d=2, Z=40)
    dp = DifferentialPrivacy(4.0, 1e-6, unit="device", data_bound=30.0, clip_norm=300.0,
                             noise_seed=0)   # an owner weighs at most 10 rows of its 50
    p = PrivateGaussProtocol(privacy=dp, n_features=2)
    assert p.plan.releases[0].sensitivity == pytest.approx(math.sqrt(3) * 10)
    state = p.start(range(40), 0)
    msg = p.client_step(p.next_request(state), Xs[0], device_id=0, seed=0, state={})
    norm = math.sqrt(float((msg.n ** 2).sum() + (msg.s ** 2).sum()
                           + (msg.Q[:, [0, 1, 3]] ** 2).sum()))
    sens = p.plan.releases[0].sensitivity   # 50 rows: clipped (Σ u uᵀ counted in full)
    assert 0.95 * sens < norm <= sens + 1e-9
    # a clip_norm no owner reaches changes nothing: device level = point level at ε = ∞
    inf_dev = DifferentialPrivacy(math.inf, 1e-6, unit="device", data_bound=30.0,
                                  clip_norm=1e6)
    inf_pt = DifferentialPrivacy(math.inf, 1e-6, data_bound=30.0)
    a = FedGaussClustering(privacy=inf_dev, random_state=0).fit(Xs)
    b = FedGaussClustering(privacy=inf_pt, random_state=0).fit(Xs)
    assert np.array_equal(a.means_, b.means_)


def test_diag_covariance_runs_privately():
    Xs, X, y = owners(seed=12, n=4000, k=4, d=6)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=40.0, noise_seed=2)
    m = FedGaussClustering(covariance="diag", privacy=dp, random_state=0).fit(Xs)
    assert adjusted_rand_score(y, m.labels_) > 0.8
    assert (m.covariances_ > 0).all()


@pytest.mark.parametrize("privacy, text", [
    (DifferentialPrivacy(1.0, 1e-6), "needs data_bound"),
    (DifferentialPrivacy(1.0, 1e-6, unit="device", data_bound=3.0), "needs clip_norm"),
    (DifferentialPrivacy(1e-4, 1e-6, data_bound=3.0), "smallest epsilon that works is"),
    ({"epsilon": 1.0}, "must be a fedclust.privacy.DifferentialPrivacy"),
])
def test_bad_privacy_is_one_line(privacy, text):
    Xs, _, _ = owners(n=300)
    with pytest.raises(ValidationError) as exc:
        FedGaussClustering(privacy=privacy).fit(Xs)
    assert text in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.slow
def test_flower_simulation_gives_the_same_noisy_fit():
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from fedclust.flower.transport import FlowerSimulationTransport

    Xs, _, _ = owners(seed=4, n=900, k=3, Z=3)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=30.0, noise_seed=5)
    a = FedGaussClustering(privacy=dp, n_rounds=2, random_state=1).fit(Xs)
    b = FedGaussClustering(privacy=dp, n_rounds=2, random_state=1).fit(
        Xs, transport=FlowerSimulationTransport())
    assert np.array_equal(a.means_, b.means_) and np.array_equal(a.scatters_, b.scatters_)
