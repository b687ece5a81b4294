"""The adaptive new-cluster covariance (``adaptive_prior``) and the separated-blob generator."""

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from fedclust import EvolvingGaussians, FedGaussClustering, ValidationError
from fedclust.gauss.datasets import separated_blobs
from fedclust.gauss.local import from_message, learn_local, to_message
from fedclust.gauss.model import MIN_PRIOR_FACTOR, PRIOR_QUANTILE, ClusterSet, Settings
from fedclust.gauss.protocol import model_message
from fedclust.gauss.server import merge_messages
from fedclust.gauss.stats import moments


def _small_clusters(seed=6, k=40, D=4):
    """k blobs of 4x-varying widths (0.5-2) in D dims, centres uniform in a box growing
    like k^(1/D) (the benchmark's ``blobs_40_4_6``): the volume rule's Sigma_0 is several
    times wider than the smaller clusters (the under-counting case)."""
    rng = np.random.default_rng(seed)
    box = 10 * k ** (1 / D)
    X, y = make_blobs(n_samples=rng.integers(100, 400, k), n_features=D,
                      cluster_std=rng.uniform(0.5, 2.0, k), center_box=(-box, box),
                      random_state=seed)
    return X, y


def test_factor_is_the_lower_quartile_of_unbiased_cluster_volumes():
    rng = np.random.default_rng(0)
    D = 3
    cs = ClusterSet(D, Settings())
    cs.set_global(1000, np.zeros(D), 1000 * np.array([100.0, 200.0, 300.0]))
    sig = [0.2, 0.5, 1.0, 2.0, 0.05]
    n = [4, 10, 30, 8, 2]  # the last is immature (n < D + 1): ignored
    for s, k in zip(sig, n):
        Z = rng.normal(size=(k, D)) * np.sqrt(s)
        S = (Z - Z.mean(0)).T @ (Z - Z.mean(0))
        cs.add(Z.mean(0)[None], S[None], np.array([float(k)]), np.array([-1]), np.array([0]))
    cs.adapt_prior()
    # independent hand computation: E log det(scatter) = log det Sigma + sum_i psi((n-i)/2) + D log 2
    from scipy.special import digamma
    ratios = []
    for j in range(4):
        A = cs.S[j] + 0.1 * np.diag(cs.s0_rule)
        ld = np.linalg.slogdet(A)[1] - sum(digamma((cs.n[j] - i) / 2) for i in range(1, D + 1))
        ld -= D * np.log(2)
        ratios.append(np.exp((ld - np.log(cs.s0_rule).sum()) / D))
    expect = min(1.0, max(np.quantile(ratios, PRIOR_QUANTILE), MIN_PRIOR_FACTOR))
    assert cs.prior_factor == pytest.approx(expect, rel=1e-12)
    assert cs.prior_factor < 1.0
    np.testing.assert_allclose(cs.s0, cs.s0_rule * cs.prior_factor)
    # the caches follow: a new cluster's covariance is the shrunk Sigma_0
    np.testing.assert_allclose(cs.covariance(np.array([0]))[0],
                               (cs.S[0] + cs.n0 * np.diag(cs.s0)) / (cs.n[0] + cs.n0 - 1))


def test_corrected_log_det_is_unbiased_for_few_samples():
    """The Wishart correction makes small clusters' log det unbiased (Monte Carlo)."""
    from scipy.special import digamma
    rng = np.random.default_rng(1)
    D, n, Sig = 3, 5, np.diag([1.0, 2.0, 3.0])
    lds = []
    for _ in range(4000):
        Z = rng.multivariate_normal(np.zeros(D), Sig, n)
        lds.append(np.linalg.slogdet((Z - Z.mean(0)).T @ (Z - Z.mean(0)))[1])
    corrected = np.mean(lds) - digamma((n - np.arange(1, D + 1)) / 2).sum() - D * np.log(2)
    assert corrected == pytest.approx(np.log(6.0), abs=0.05)
    assert np.mean(lds) - D * np.log(n) < np.log(6.0) - 0.5  # the naive S / n is far off


def test_factor_never_enlarges_and_needs_two_mature_clusters():
    D = 2
    cs = ClusterSet(D, Settings())
    cs.set_global(100, np.zeros(D), 100 * np.ones(D))
    big = 1e4 * np.eye(D)[None]
    cs.add(np.zeros((1, D)), big, np.array([50.0]), np.array([-1]), np.array([0]))
    assert cs.adapt_prior() is False and cs.prior_factor == 1.0  # one mature cluster
    cs.add(np.ones((1, D)), big, np.array([50.0]), np.array([-1]), np.array([0]))
    cs.adapt_prior()
    assert cs.prior_factor == 1.0  # clusters wider than the rule: Sigma_0 unchanged
    off = ClusterSet(D, Settings(adaptive_prior=False))
    off.set_global(100, np.zeros(D), 100 * np.ones(D))
    off.add(np.zeros((2, D)), np.repeat(1e-3 * np.eye(D)[None], 2, 0), np.array([50.0, 50.0]),
            np.array([-1, -1]), np.array([0, 0]))
    off.adapt_prior()
    assert off.prior_factor == 1.0


def test_server_factor_is_order_free_and_rebuilt_exactly_by_owners():
    X, _ = _small_clusters()
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    s = Settings()
    msgs = [to_message(learn_local(X[p], None, s, 0), 1, moments(X[p])) for p in parts]
    a = merge_messages(msgs, s, 0)
    b = merge_messages(msgs[::-1], s, 0)
    assert a.prior_factor < 1.0  # the feature is exercised
    assert b.prior_factor == a.prior_factor and b.C == a.C
    np.testing.assert_array_equal(b.mu[:a.C], a.mu[:a.C])
    rebuilt = from_message(model_message(a), s, 0)
    assert rebuilt.prior_factor == a.prior_factor
    # (the caches agree to round-off; every owner and the estimator use the rebuilt model)
    np.testing.assert_allclose(rebuilt.P[:a.C], a.P[:a.C], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rebuilt.ld[:a.C], a.ld[:a.C], rtol=1e-12)


def test_adaptive_prior_recovers_small_clusters_the_fixed_rule_swallows():
    X, y = _small_clusters()
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    owners = [X[p] for p in parts]
    on = FedGaussClustering(random_state=0).fit(owners)
    off = FedGaussClustering(random_state=0, adaptive_prior=False).fit(owners)
    ari_on = adjusted_rand_score(y, on.predict(X))
    ari_off = adjusted_rand_score(y, off.predict(X))
    # measured: fixed rule 0.73 ARI / 28 clusters; adaptive ~0.9 / 36 (oracle GMM 1.0)
    assert ari_on >= 0.85 and abs(on.n_clusters_ - 40) <= 8
    assert ari_on > ari_off + 0.1 and on.n_clusters_ > off.n_clusters_


def test_online_model_adapts_and_stays_bounded():
    X, _ = _small_clusters(1, k=30)
    m = EvolvingGaussians(max_clusters=60).partial_fit(X)
    assert m._cs.prior_factor < 1.0
    assert m.n_clusters_ <= 60
    assert np.all(np.isfinite(m.covariances_))


def test_adaptive_prior_must_be_a_bool():
    with pytest.raises(ValidationError, match="adaptive_prior"):
        FedGaussClustering(adaptive_prior="yes").fit([np.zeros((5, 2)) + np.arange(5)[:, None]])


@pytest.mark.parametrize("k, D", [(15, 2), (20, 3), (12, 5)])
def test_separated_blobs_keep_their_separation(k, D):
    X, y = separated_blobs(3, k, D, separation=2.5)
    assert X.shape[1] == D and set(np.unique(y)) == set(range(1, k + 1))
    sizes = np.bincount(y)[1:]
    assert sizes.min() >= 100 and sizes.max() < 400
    # the realised centres and widths keep (roughly) the promised separation
    mu = np.array([X[y == c].mean(0) for c in range(1, k + 1)])
    sd = np.array([X[y == c].std(0).mean() for c in range(1, k + 1)])
    d = np.linalg.norm(mu[:, None] - mu[None], axis=2)
    need = 2.5 * (sd[:, None] + sd[None])
    np.fill_diagonal(d, np.inf)
    assert np.all(d >= 0.8 * need)
    X2, y2 = separated_blobs(3, k, D, separation=2.5)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_adaptive_model_is_the_same_on_flower():
    from fedclust.flower import FlowerInMemoryTransport
    X, _ = _small_clusters(2, k=20, D=3)
    parts = np.array_split(np.random.default_rng(1).permutation(len(X)), 3)
    owners = [X[p] for p in parts]
    a = FedGaussClustering(random_state=0).fit(owners)
    b = FedGaussClustering(random_state=0).fit(owners, transport=FlowerInMemoryTransport())
    assert a._cs.prior_factor < 1.0
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.covariances_, b.covariances_)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


def test_volume_criterion_is_gated_by_the_valley_between_the_pair():
    """5-D: a narrow (sigma 0.5) and a wide (sigma 2) cluster 2.5 (0.5 + 2) apart do not
    overlap, yet their pooled det is below the wide one's, so the paper's criterion alone
    merges them; with merge_test="both" the volume criterion needs a mixture without a
    valley between the means, and the likelihood test keeps them apart."""
    rng = np.random.default_rng(0)
    D = 5
    scores = {}
    for test in ("volume", "both"):
        cs = ClusterSet(D, Settings(merge_test=test))
        cs.set_global(10000, np.zeros(D), 10000 * 100 * np.ones(D))
        for sd, shift in ((0.5, 0.0), (2.0, 6.25)):
            Z = rng.normal(size=(200, D)) * sd
            Z[:, 0] += shift
            S = (Z - Z.mean(0)).T @ (Z - Z.mean(0))
            cs.add(Z.mean(0)[None], S[None], np.array([200.0]), np.array([-1]), np.array([0]))
        assert cs.ld[1] > cs.ld[0]
        scores[test] = float(cs._merge_scores(np.array([0]), np.array([1]))[0][0])
    assert scores["volume"] < 0 < scores["both"]


@pytest.mark.parametrize("covariance", ["full", "diag"])
@pytest.mark.parametrize("delta", [1.0, 2.5, 3.2, 3.6, 5.0])
def test_dip_is_the_closed_form_for_two_equal_gaussians(delta, covariance):
    """Two equal Gaussians delta sigma apart (equal weights): the mixture on the segment
    is lowest at the midpoint when delta > 2, where log f(1/2) - log f(0) =
    log(2 exp(-delta^2/8) / (1 + exp(-delta^2/2))); unimodal (0) when delta <= 2."""
    D = 3
    cs = ClusterSet(D, Settings(covariance=covariance))
    cs.set_global(1000, np.zeros(D), 1000 * np.ones(D))
    S = 50.0 * np.diag([1.0, 2.0, 0.5])
    if covariance == "diag":
        S = np.diag(S)
    cs.add(np.zeros((1, D)), S[None], np.array([51.0]), np.array([-1]), np.array([0]))
    cov = cs.covariance(np.array([0]))[0]
    sigma = np.sqrt(cov[0, 0] if covariance == "full" else cov[0])
    mu = np.array([[delta * sigma, 0.0, 0.0]])
    cs.add(mu, S[None], np.array([51.0]), np.array([-1]), np.array([0]))
    got = float(cs._dip(np.array([0]), np.array([1]))[0])
    want = min(0.0, np.log(2 * np.exp(-delta ** 2 / 8)) - np.log1p(np.exp(-delta ** 2 / 2)))
    assert got == pytest.approx(want, abs=1e-9)
    assert (got < -0.75) == (delta > 3.4)  # the default max_dip sits near 3.4 sigma


def test_valley_gate_keeps_neighbouring_5d_blobs_apart():
    """5-D separated blobs (2.5 (sigma_i + sigma_j) apart): without the valley gate the
    volume rule joins young clusters of neighbouring blobs (measured ARI 0.77, 19 of 25
    clusters); with it (default) 0.98 and 26."""
    X, y = separated_blobs(5, 25, 5, separation=2.5)
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    owners = [X[p] for p in parts]
    gated = FedGaussClustering(random_state=0).fit(owners)
    ungated = FedGaussClustering(random_state=0, max_dip=np.inf).fit(owners)
    a_gated = adjusted_rand_score(y, gated.predict(X))
    assert a_gated >= 0.95 and abs(gated.n_clusters_ - 25) <= 3
    assert a_gated > adjusted_rand_score(y, ungated.predict(X)) + 0.1


def test_pilot_pass_recovers_10d_blobs_like_a_gaussian_mixture():
    """10-D make_blobs: the volume rule's Sigma_0 (a 0.003 volume fraction is 0.56 of the
    global spread per dimension) lets the first clusters swallow neighbouring blobs in a
    single pass (online model: ARI 0.87); ``fit`` and each owner stream the rows twice,
    the pilot measuring Sigma_0, and match scikit-learn's GaussianMixture given k."""
    from sklearn.mixture import GaussianMixture
    X, y = make_blobs(n_samples=3000, centers=20, n_features=10, random_state=0)
    ref = adjusted_rand_score(y, GaussianMixture(20, random_state=0).fit(X).predict(X))
    one = EvolvingGaussians().fit(X)
    online = EvolvingGaussians().partial_fit(X).compact()
    assert adjusted_rand_score(y, one.predict(X)) >= ref - 0.02
    assert one.n_clusters_ == 20
    assert adjusted_rand_score(y, online.predict(X)) < ref - 0.05
    assert one._cs.prior_factor < 0.2  # the pilot's factor, not the volume rule's 1
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    fed = FedGaussClustering(random_state=0).fit([X[p] for p in parts])
    assert adjusted_rand_score(y, fed.predict(X)) >= ref - 0.02


@pytest.mark.parametrize("bad", [-0.1, np.nan, "deep"])
def test_max_dip_must_be_a_nonnegative_number(bad):
    with pytest.raises(ValidationError, match="max_dip"):
        FedGaussClustering(max_dip=bad).fit([np.arange(10.0).reshape(5, 2)] * 2)


def test_third_pass_when_most_rows_stay_in_immature_clusters(monkeypatch):
    """10-D blobs whose widths vary 4x (volumes 10^6x): the lower-quartile Sigma_0 leaves
    the wide blobs' rows as singletons (measured: 63 % of the rows outside mature clusters,
    ARI 0.50); the owners then learn once more with the median volume (ARI 0.96)."""
    import fedclust.gauss.local as local
    X, y = separated_blobs(2, 30, 10, separation=2.5)
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    owners = [X[p] for p in parts]
    with_third = FedGaussClustering(random_state=0).fit(owners)
    monkeypatch.setattr(local, "MAX_IMMATURE_SHARE", 1.0)
    without = FedGaussClustering(random_state=0).fit(owners)
    a3 = adjusted_rand_score(y, with_third.predict(X))
    assert a3 >= 0.9 and abs(with_third.n_clusters_ - 30) <= 6
    assert a3 > adjusted_rand_score(y, without.predict(X)) + 0.2
