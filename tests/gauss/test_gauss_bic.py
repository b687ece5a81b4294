"""The BIC merge criterion, plain data (one Gaussian, blobs), sample conservation, and
the separated-blob generator."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from fedclust import EvolvingGaussians, FedGaussClustering, ValidationError
from fedclust.gauss import fast_scan
from fedclust.gauss.datasets import separated_blobs
from fedclust.gauss.model import ClusterSet, Settings
from fedclust.gauss.stats import merge_clusters, moments, neighbour_variance


def _scatter(Z):
    m = Z.mean(0)
    return (Z - m).T @ (Z - m)


def _two(A, B, settings=None):
    cs = ClusterSet(A.shape[1], settings or Settings())
    U = np.vstack([A, B])
    cs.set_global(*moments(U))
    cs.add(np.stack([A.mean(0), B.mean(0)]), np.stack([_scatter(A), _scatter(B)]),
           np.array([len(A), len(B)], float), np.full(2, -1), np.zeros(2, np.int64))
    return cs


def _bic_by_hand(Zs, ridge, n_total):
    """min over {full, diag} of -2 log-lik + params log n of the groups Zs (one Gaussian
    each, ML covariance + ridge / n), plus the labels and the mixing weights."""
    D = Zs[0].shape[1]
    best = np.inf
    for full in (True, False):
        ll = 0.0
        for Z in Zs:
            C = np.cov(Z.T, bias=True).reshape(D, D) + np.diag(ridge) / len(Z)
            if not full:
                C = np.diag(np.diag(C))
            ll += multivariate_normal(Z.mean(0), C).logpdf(Z).sum()
            ll += len(Z) * np.log(len(Z) / n_total) if len(Zs) > 1 else 0.0
        npar = D + (D * (D + 1) // 2 if full else D)
        best = min(best, -2 * ll + (len(Zs) * npar + len(Zs) - 1) * np.log(n_total))
    return best


@pytest.mark.parametrize("D", [1, 3])
def test_bic_score_equals_scipy_log_likelihoods_and_is_invariant(D):
    rng = np.random.default_rng(7)
    A = rng.normal(0, 1, (300, D)) @ rng.normal(size=(D, D))
    B = rng.normal(0, 1, (120, D)) * np.linspace(0.5, 2, D) + 1.5
    # a negligible pseudo-sample (volume_fraction 1e-12): the maximum-likelihood BIC exactly
    cs = _two(A, B, Settings(volume_fraction=1e-12))
    n, _, S = merge_clusters(cs.n[[0]], cs.mu[[0]], cs.S[[0]], cs.n[[1]], cs.mu[[1]], cs.S[[1]])
    got = cs._bic_scores(np.array([0]), np.array([1]), n, S)[0]
    U = np.vstack([A, B])
    zero = np.zeros(D)
    # the score is the BIC difference per sample minus the tolerance merge_tol
    want = (_bic_by_hand([U], zero, 420) - _bic_by_hand([A, B], zero, 420)) / 840
    assert got == pytest.approx(want - cs.s.merge_tol, rel=1e-8, abs=1e-10)
    cs0 = _two(A, B, Settings(volume_fraction=1e-12, merge_tol=0.0))
    assert cs0._bic_scores(np.array([0]), np.array([1]), n, S)[0] == pytest.approx(
        want, rel=1e-8, abs=1e-10)
    cs = _two(A, B)  # the default pseudo-sample moves the score only a little
    got = cs._bic_scores(np.array([0]), np.array([1]), n, S)[0]
    assert got + cs.s.merge_tol == pytest.approx(want, rel=0.05)
    # symmetric in the pair; unchanged by rescaling a feature (the ridge follows the scale)
    assert cs._bic_scores(np.array([1]), np.array([0]), n, S)[0] == pytest.approx(got, rel=1e-10)
    k = np.logspace(-1, 1, D)  # within the variance floor's range (1e-6 of the median)
    cs2 = _two(A * k, B * k)
    n2, _, S2 = merge_clusters(cs2.n[[0]], cs2.mu[[0]], cs2.S[[0]], cs2.n[[1]], cs2.mu[[1]],
                               cs2.S[[1]])
    assert cs2._bic_scores(np.array([0]), np.array([1]), n2, S2)[0] == pytest.approx(
        got, rel=1e-8, abs=1e-10)


def test_bic_threshold_moves_with_the_evidence():
    # two unit Gaussians delta apart (2-D, exact statistics): the labels cost log 2 per
    # sample, one Gaussian loses 0.5 log(1 + delta^2 / 4): without the penalty the pair
    # merges iff delta < 2 sqrt 3. The penalty per sample shrinks with n: at delta = 4.5
    # (two Gaussians gain 0.21 nats per sample) 10 + 10 samples merge, 2000 + 2000 do not.
    # merge_tol = 0.01 nats per sample moves the bound from delta = 3.46 to about 3.5
    def merged(delta, n):
        cs = ClusterSet(2, Settings())
        cs.set_global(2 * n, np.zeros(2), np.full(2, 2 * n * 100.0))
        cs.add(np.array([[0.0, 0.0], [delta, 0.0]]), np.stack([n * np.eye(2)] * 2),
               np.full(2, float(n)), np.full(2, -1), np.zeros(2, np.int64))
        cs.merge_all()
        return cs.C == 1

    assert merged(1.0, 2000) and merged(3.4, 2000) and not merged(3.6, 2000)
    assert merged(4.5, 10) and not merged(4.5, 2000)
    assert not merged(8.0, 10)


def test_neighbour_variance_follows_the_local_scale():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    v1 = neighbour_variance(X, np.ones(3))
    v2 = neighbour_variance(X * 10, np.full(3, 100.0))  # scale-free in units of var
    assert v1 == pytest.approx(v2, rel=1e-9)
    assert 0 < v1 < 1  # a neighbourhood is narrower than the whole Gaussian
    tight = neighbour_variance(np.vstack([X * 0.1, X * 0.1 + 50]), np.ones(3))
    assert tight < v1  # two tight, far blobs: a much smaller neighbourhood


# -- plain data: seeds, dimensions and sizes not used to design the rule -------------------
@pytest.mark.parametrize("seed, D, n", [(11, 2, 900), (12, 4, 2500), (13, 7, 1200),
                                        (14, 12, 3000), (15, 3, 400)])
def test_one_gaussian_is_one_cluster(seed, D, n):
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(D, D)) + 2 * np.eye(D)  # correlated, unequal variances
    X = rng.normal(size=(n, D)) @ L.T + rng.normal(size=D) * 5
    fc = FedGaussClustering(random_state=seed).fit(np.array_split(X, 3))
    top = np.sort(fc.counts_)[::-1]
    assert fc.n_clusters_ <= 2 and top[:2].sum() >= 0.95 * n
    assert fc.counts_.sum() + fc.removed_samples_ == n and fc.removed_samples_ == 0
    m = EvolvingGaussians().fit(X[rng.permutation(n)])
    assert m.n_clusters_ <= 2 and np.sort(m.counts_)[::-1][:2].sum() >= 0.95 * n


@pytest.mark.parametrize("seed, D, n, owners", [
    (41, 1, 20000, 1), (42, 2, 20000, 1), (43, 1, 6000, 3), (44, 3, 12000, 2),
    (45, 8, 4000, 1), (46, 1, 500, 1), (47, 5, 15000, 3)])
def test_one_gaussian_is_one_cluster_at_any_size_and_owner_count(seed, D, n, owners):
    # the case plain BIC (merge_tol=0) gets wrong once n is large: adjacent pieces of one
    # Gaussian tie per sample and the tie is broken by O(n) noise against a log n penalty
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(D, D)) * rng.uniform(0.3, 3.0, D) + np.eye(D)
    X = rng.normal(size=(n, D)) @ L.T + rng.uniform(-5, 5, D)
    parts = np.array_split(rng.permutation(n), owners)
    fc = FedGaussClustering(random_state=seed).fit([X[p] for p in parts])
    assert fc.n_clusters_ <= 2 and np.sort(fc.counts_)[::-1][:2].sum() >= 0.95 * n
    m = EvolvingGaussians().fit(X)  # one owner, rows in the given order
    assert m.n_clusters_ <= 2 and np.sort(m.counts_)[::-1][:2].sum() >= 0.95 * n
    assert m.counts_.sum() + m.removed_samples_ == n


def test_merge_tol_is_an_effect_size_and_is_validated():
    # two unit Gaussians 4 apart, 2000 + 2000 samples (exact statistics, 2-D): two describe
    # them 0.5 log 5 - log 2 = 0.112 nats per sample better than one, less the penalty
    # 6 log 4000 / 8000 = 0.006: apart for merge_tol < 0.105, merged above
    def merged(tol):
        cs = ClusterSet(2, Settings(merge_tol=tol))
        cs.set_global(4000, np.zeros(2), np.full(2, 4000 * 100.0))
        cs.add(np.array([[0.0, 0.0], [4.0, 0.0]]), np.stack([2000 * np.eye(2)] * 2),
               np.full(2, 2000.0), np.full(2, -1), np.zeros(2, np.int64))
        cs.merge_all()
        return cs.C == 1

    assert not merged(0.0) and not merged(0.01) and not merged(0.1)
    assert merged(0.11) and merged(0.5)
    with pytest.raises(ValidationError, match="merge_tol"):
        EvolvingGaussians(merge_tol=-0.1).fit(np.random.default_rng(0).normal(size=(50, 2)))


@pytest.mark.parametrize("seed, D, k", [(21, 2, 4), (22, 5, 6), (23, 9, 5)])
def test_separated_blobs_are_the_blobs(seed, D, k):
    X, y = make_blobs(n_samples=300 * k, n_features=D, centers=k, cluster_std=1.0,
                      center_box=(-12 * k ** (1 / D), 12 * k ** (1 / D)), random_state=seed)
    # keep centres well apart so that the reference itself is unambiguous
    fc = FedGaussClustering(random_state=seed).fit(np.array_split(X, 3))
    assert fc.n_clusters_ == k
    assert adjusted_rand_score(y, fc.predict(X)) >= 0.98


def test_uniform_square_is_tiles_not_single_points():
    # no Gaussian describes a square; BIC on its tiles gives a bounded count (measured
    # 11-17 for 1,500 points; GaussianMixture with BIC: 6), never one cluster per few points
    X = np.random.default_rng(5).uniform(size=(1500, 2))
    fc = FedGaussClustering(random_state=0).fit(np.array_split(X, 3))
    assert 1 <= fc.n_clusters_ <= 25 and fc.counts_.min() >= 15
    assert fc.counts_.sum() == 1500


# -- conservation: every sample is in a cluster or counted as removed -----------------------
@pytest.mark.parametrize("merge_test", ["bic", "volume"])
def test_stream_conserves_samples_on_random_streams(merge_test):
    for seed in range(12):
        rng = np.random.default_rng(seed)
        D = int(rng.integers(1, 5))
        cap = int(rng.integers(2, 12))
        centres = rng.normal(size=(int(rng.integers(1, 6)), D)) * 8
        m = EvolvingGaussians(max_clusters=cap, merge_test=merge_test)
        seen = 0
        for _ in range(int(rng.integers(1, 5))):
            b = int(rng.integers(1, 120))
            X = centres[rng.integers(0, len(centres), b)] + rng.normal(size=(b, D))
            m.partial_fit(X)
            seen += b
            assert m.n_samples_seen_ == seen
            assert m.counts_.sum() + m.removed_samples_ == seen
            assert m.n_clusters_ <= cap
        m.compact()
        assert m.counts_.sum() + m.removed_samples_ == seen


def test_nothing_is_removed_below_the_cap_and_federation_conserves():
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        D = int(rng.integers(1, 6))
        owners = [rng.normal(size=(int(rng.integers(5, 200)), D)) * rng.uniform(0.5, 3)
                  + rng.integers(0, 3) * 10 for _ in range(int(rng.integers(1, 5)))]
        total = sum(len(o) for o in owners)
        fc = FedGaussClustering(random_state=seed).fit(owners)
        assert fc.removed_samples_ == 0 and fc.counts_.sum() == total
        kappa_n, cap = int(rng.integers(0, 4)), int(rng.integers(1, 4))
        fc = FedGaussClustering(random_state=seed, kappa_n=kappa_n, max_clusters=cap).fit(owners)
        assert fc.counts_.sum() + fc.removed_samples_ == total
        assert sum(fc.removed_by_owner_.values()) <= fc.removed_samples_
        # the run log carries the same removals, per owner and on the server
        log = fc.run_log_
        assert {z: c for z, c in fc.removed_by_owner_.items() if c} == log.removed
        assert sum(log.removed.values()) + log.removed_by_server == fc.removed_samples_
        m = EvolvingGaussians().fit(np.vstack(owners))
        assert m.counts_.sum() == total and m.removed_samples_ == 0


def test_numba_is_a_dependency_and_the_merge_test_is_validated():
    assert fast_scan.HAVE_NUMBA  # installed with the package (pyproject dependencies)
    with pytest.raises(ValidationError, match="merge_test"):
        FedGaussClustering(merge_test="both").fit([np.arange(10.0).reshape(5, 2)] * 2)


@pytest.mark.parametrize("k, D", [(15, 2), (20, 3), (12, 5)])
def test_separated_blobs_keep_their_separation(k, D):
    X, y = separated_blobs(3, k, D, separation=2.5)
    assert X.shape[1] == D and set(np.unique(y)) == set(range(1, k + 1))
    sizes = np.bincount(y)[1:]
    assert sizes.min() >= 100 and sizes.max() < 400
    mu = np.array([X[y == c].mean(0) for c in range(1, k + 1)])
    sd = np.array([X[y == c].std(0).mean() for c in range(1, k + 1)])
    d = np.linalg.norm(mu[:, None] - mu[None], axis=2)
    need = 2.5 * (sd[:, None] + sd[None])
    np.fill_diagonal(d, np.inf)
    assert np.all(d >= 0.8 * need)
    X2, y2 = separated_blobs(3, k, D, separation=2.5)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_run_log_reports_removals_and_survives_json():
    from fedclust.flower.results import log_from_json, log_to_json

    rng = np.random.default_rng(7)
    owners = [rng.normal(size=(150, 2)) + 8 * rng.integers(0, 3, size=(150, 1))
              for _ in range(3)]
    fc = FedGaussClustering(random_state=0, kappa_n=5, max_clusters=2).fit(owners)
    log = fc.run_log_
    assert fc.removed_samples_ > 0  # a cap of 2 clusters for 3 blobs must drop one
    assert sum(log.removed.values()) + log.removed_by_server == fc.removed_samples_
    assert fc.counts_.sum() + fc.removed_samples_ == 450
    back = log_from_json(log_to_json(log))
    assert back.removed == log.removed and back.removed_by_server == log.removed_by_server
    clean = FedGaussClustering(random_state=0).fit(owners).run_log_
    assert clean.removed == {} and clean.removed_by_server == 0
