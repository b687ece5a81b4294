"""Exact statistics: Chan's merge, pooled scatter, rank-one caches, merging = batch union."""

import numpy as np
import pytest

from fedclust.gauss.local import learn_local, to_message
from fedclust.gauss.model import ClusterSet, Settings
from fedclust.gauss.server import merge_messages
from fedclust.gauss.stats import (merge_clusters, merge_moments, moments, pack_scatter,
                                  unpack_scatter)


def scatter(X):
    m = X.mean(axis=0)
    S = (X - m).T @ (X - m)
    # BLAS may leave the product asymmetric in the last bit (thread count, load);
    # the codec promises an exact round trip of a symmetric matrix, so test on one.
    return (S + S.T) / 2


def test_chan_merge_equals_numpy_on_the_union():
    rng = np.random.default_rng(0)
    A, B = rng.normal(3, 2, (37, 4)), rng.normal(-1, 5, (11, 4))
    n, mean, m2 = merge_moments(moments(A), moments(B))
    U = np.vstack([A, B])
    assert n == 48
    np.testing.assert_allclose(mean, U.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(m2 / n, U.var(axis=0), rtol=1e-12)
    assert merge_moments((0, np.zeros(4), np.zeros(4)), moments(A))[0] == 37


def test_pooled_scatter_equals_batch_scatter():
    rng = np.random.default_rng(1)
    A, B = rng.normal(0, 1, (20, 3)), rng.normal(4, 2, (9, 3))
    n, mu, S = merge_clusters(np.array([20.0]), A.mean(0)[None], scatter(A)[None],
                              np.array([9.0]), B.mean(0)[None], scatter(B)[None])
    U = np.vstack([A, B])
    np.testing.assert_allclose(mu[0], U.mean(0), rtol=1e-12)
    np.testing.assert_allclose(S[0], scatter(U), rtol=1e-11)
    _, _, Sd = merge_clusters(np.array([20.0]), A.mean(0)[None], np.diag(scatter(A))[None],
                              np.array([9.0]), B.mean(0)[None], np.diag(scatter(B))[None])
    np.testing.assert_allclose(Sd[0], np.diag(scatter(U)), rtol=1e-11)


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(2)
    S = np.stack([scatter(rng.normal(size=(10, 5))) for _ in range(3)])
    P = pack_scatter(S)
    assert P.shape == (3, 15)
    np.testing.assert_array_equal(unpack_scatter(P, 5), S)


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_online_statistics_are_exact_and_caches_match_a_fresh_cholesky(covariance):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 6)) @ rng.normal(size=(6, 6))
    s = Settings(covariance=covariance, n_sigma=1e6)  # one cluster takes everything
    cs = ClusterSet(6, s)  # the online pass alone (learn_local may then split: diag model)
    cs.set_global(*moments(X))
    cs.learn(X)
    assert cs.C == 1
    np.testing.assert_allclose(cs.mu[0], X.mean(0), rtol=1e-10, atol=1e-12)
    want = scatter(X) if covariance == "full" else np.diag(scatter(X))
    np.testing.assert_allclose(cs.S[0], want, rtol=1e-9, atol=1e-9)
    P, ld = cs.P[:1].copy(), cs.ld[:1].copy()
    cs.refresh(np.array([0]))  # rank-one updated precision == Cholesky-based precision
    np.testing.assert_allclose(P, cs.P[:1], rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(ld, cs.ld[:1], rtol=1e-9)
    Sig = cs.covariance(np.array([0]))[0]
    sign, ld_np = np.linalg.slogdet(Sig if covariance == "full" else np.diag(Sig))
    assert sign > 0 and ld_np == pytest.approx(cs.ld[0], rel=1e-10)


def test_merging_two_models_equals_learning_their_union():
    rng = np.random.default_rng(4)
    A, B = rng.normal(0, 1, (150, 3)), rng.normal(0.5, 1.2, (90, 3))
    s = Settings(n_sigma=1e6, kappa_m=1e9, max_volume=1e9)
    msgs = [to_message(learn_local(Z, None, s, 0), 0, moments(Z)) for Z in (A, B)]
    srv = merge_messages(msgs, s, 0)
    U = np.vstack([A, B])
    assert srv.C == 1
    np.testing.assert_allclose(srv.mu[0], U.mean(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(srv.S[0], scatter(U), rtol=1e-9)
    assert srv.n[0] == 240
    count, mean, m2 = srv.g
    np.testing.assert_allclose(m2 / count, U.var(axis=0), rtol=1e-12)


def test_merge_criterion_by_hand_in_one_dimension():
    # two unit clusters at distance delta merge iff (1 + delta^2/4)/2 < kappa_m (det volume)
    s = Settings(kappa_m=1.5, max_volume=1e9, prior_weight=1.0, n_sigma=100.0,
                 merge_test="volume")
    for delta, merged in ((2.75, True), (2.9, False)):  # threshold 2 sqrt(2) = 2.83
        cs = ClusterSet(1, s)
        cs.set_global(10**6, np.zeros(1), np.full(1, 10**6 * 100.0))
        n = 10**6  # large n: Sigma = S / n to within 1e-6
        cs.add(np.array([[0.0], [delta]]), np.full((2, 1, 1), float(n)), np.full(2, float(n)),
               np.full(2, -1), np.zeros(2, np.int64))
        cs.merge_all()
        assert (cs.C == 1) is merged


def test_bic_merge_joins_a_large_cluster_split_in_tiles():
    # one Gaussian blob cut into 4 quadrant tiles: with kappa_m = 1.2 the volume criterion
    # keeps the tiles (det ratio of two quadrants 1 / (1 - 2/pi) / 2 = 1.38); BIC puts the
    # blob back together (one Gaussian explains two quadrants better than two do)
    X = np.random.default_rng(3).normal(size=(4000, 2))
    parts = [X[((X[:, 0] > 0) == a) & ((X[:, 1] > 0) == b)] for a in (0, 1) for b in (0, 1)]
    for test, want in (("volume", 4), ("bic", 1)):
        s = Settings(merge_test=test, max_volume=1e9, kappa_m=1.2)
        cs = ClusterSet(2, s)
        cs.set_global(*moments(X))
        cs.add(np.stack([P.mean(0) for P in parts]), np.stack([scatter(P) for P in parts]),
               np.array([len(P) for P in parts], float), np.full(4, -1), np.zeros(4, np.int64))
        cs.merge_all()
        assert cs.C == want
        assert cs.n[:cs.C].sum() == 4000


def test_compiled_loop_matches_the_numpy_loop(monkeypatch):
    from fedclust.gauss import fast_scan

    if not fast_scan.HAVE_NUMBA:
        pytest.skip("numba is not installed: only the numpy loop exists")
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    s = Settings(gate_quantile=0.999, volume_fraction=0.05)
    fast = learn_local(X.astype(float), y, s, 3)
    monkeypatch.setattr(ClusterSet, "use_fast", False)
    slow = learn_local(X.astype(float), y, s, 3)
    assert fast.C == slow.C and fast.t == slow.t
    for name in ("mu", "S", "P", "ld", "n", "cls", "last"):
        np.testing.assert_allclose(getattr(fast, name)[:fast.C], getattr(slow, name)[:slow.C],
                                   rtol=1e-9, atol=1e-12)
    Xc = np.random.default_rng(0).normal(size=(500, 2)) * [1, 3]
    a = learn_local(Xc, None, Settings(), 0)
    monkeypatch.setattr(ClusterSet, "use_fast", True)
    b = learn_local(Xc, None, Settings(), 0)
    assert a.C == b.C
    np.testing.assert_allclose(a.mu[:a.C], b.mu[:b.C], rtol=1e-10)


def test_compact_merges_an_online_models_pieces_without_losing_a_sample():
    from fedclust import EvolvingGaussians

    rng = np.random.default_rng(0)
    means = np.array([[0.0, 0.0], [25.0, 0.0], [0.0, 25.0]])
    y = rng.integers(0, 3, 3000)
    X = means[y] + 3.0 * rng.normal(size=(3000, 2))
    m = EvolvingGaussians().partial_fit(X)
    before = m.n_clusters_
    m.compact()
    assert m.n_clusters_ == 3 < before  # the stream over-segments; compact merges by BIC
    assert m.counts_.sum() == 3000 and m.removed_samples_ == 0
    pooled = (m.counts_[:, None] * m.means_).sum(0) / 3000
    np.testing.assert_allclose(pooled, X.mean(0), rtol=1e-9, atol=1e-9)
    f = EvolvingGaussians().fit(X)  # one pass, the owner's merges, compact
    assert f.n_clusters_ == 3 and f.counts_.sum() == 3000
