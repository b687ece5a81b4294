"""Dense k-means kernels (fedclust.core.kmeans) against scipy / scikit-learn / hand computations."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from sklearn.cluster import KMeans

from conftest import blobs
from fedclust.core.kmeans import BLOCK, assign, kmeans_plusplus, lloyd, squared_distances


def _sk_lloyd(X, init, *, tol, max_iter, sample_weight=None):
    km = KMeans(n_clusters=len(init), init=init, n_init=1, algorithm="lloyd", tol=tol,
                max_iter=max_iter)
    return km.fit(X, sample_weight=sample_weight)


# ------------------------------------------------------------------ distances / assign

def test_squared_distances_matches_cdist():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 7)) * 3 + 1
    C = rng.normal(size=(6, 7))
    D = squared_distances(X, C)
    assert D.shape == (50, 6)
    np.testing.assert_allclose(D, cdist(X, C, "sqeuclidean"), rtol=1e-10, atol=1e-10)


def test_squared_distances_never_negative():
    # ||x||^2 - 2 x.c + ||c||^2 rounds below zero for x == c with large norms
    rng = np.random.default_rng(1)
    X = 1e4 + rng.normal(size=(40, 5))
    D = squared_distances(X, X)
    assert (D >= 0).all()


def test_assign_blockwise_matches_cdist():
    rng = np.random.default_rng(2)
    n = 2 * BLOCK + 123  # several blocks and a ragged tail
    X = rng.normal(size=(n, 4))
    C = rng.normal(size=(9, 4))
    labels, mind = assign(X, C)
    ref = cdist(X, C, "sqeuclidean")
    assert labels.dtype == np.int64 and labels.shape == (n,)
    np.testing.assert_array_equal(labels, ref.argmin(axis=1))
    np.testing.assert_allclose(mind, ref.min(axis=1), rtol=1e-9, atol=1e-12)


def test_assign_ties_go_to_lowest_index():
    X = np.array([[0.0], [5.0]])
    C = np.array([[1.0], [-1.0], [1.0]])
    labels, mind = assign(X, C)
    assert labels.tolist() == [0, 0]
    np.testing.assert_allclose(mind, [1.0, 16.0])


def test_assign_float32_keeps_float32():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(100, 3)).astype(np.float32)
    C = X[:4].copy()
    labels, mind = assign(X, C)
    assert mind.dtype == np.float32
    ref = cdist(X.astype(np.float64), C.astype(np.float64), "sqeuclidean")
    np.testing.assert_allclose(mind, ref.min(axis=1), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ Lloyd vs scikit-learn

@pytest.mark.parametrize("tol", [0.0, 1e-4])
def test_lloyd_matches_sklearn_well_separated(tol):
    rng = np.random.default_rng(4)
    means = 8 * rng.normal(size=(5, 3))
    X, _ = blobs(40, means, rng)
    init = X[rng.choice(len(X), 5, replace=False)]
    res = lloyd(X, init, tol=tol, max_iter=300)
    km = _sk_lloyd(X, init, tol=tol, max_iter=300)
    np.testing.assert_array_equal(res.labels, km.labels_)
    np.testing.assert_allclose(res.centers, km.cluster_centers_, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(res.inertia, km.inertia_, rtol=1e-10)
    assert res.converged


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tol,max_iter", [(0.0, 300), (1e-3, 300), (0.0, 3)])
def test_lloyd_matches_sklearn_messy(seed, tol, max_iter):
    # uniform data: no cluster structure, many Lloyd iterations
    rng = np.random.default_rng(10 + seed)
    X = rng.uniform(size=(400, 2))
    init = X[rng.choice(len(X), 8, replace=False)]
    res = lloyd(X, init, tol=tol, max_iter=max_iter)
    km = _sk_lloyd(X, init, tol=tol, max_iter=max_iter)
    assert (np.bincount(km.labels_, minlength=8) > 0).all()  # no relocation involved
    np.testing.assert_array_equal(res.labels, km.labels_)
    np.testing.assert_allclose(res.centers, km.cluster_centers_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.inertia, km.inertia_, rtol=1e-9)


def test_lloyd_weighted_matches_sklearn_sample_weight():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(200, 3))
    w = rng.uniform(0.1, 3.0, size=200)
    init = X[:6].copy()
    res = lloyd(X, init, weights=w, tol=0.0)
    km = _sk_lloyd(X, init, tol=0.0, max_iter=300, sample_weight=w)
    np.testing.assert_array_equal(res.labels, km.labels_)
    np.testing.assert_allclose(res.centers, km.cluster_centers_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.inertia, km.inertia_, rtol=1e-9)


def test_lloyd_integer_weights_equal_repeated_points():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(120, 4))
    w = rng.integers(1, 5, size=120)
    init = X[rng.choice(120, 5, replace=False)]
    a = lloyd(X, init, weights=w, tol=0.0)
    Xr = np.repeat(X, w, axis=0)
    b = lloyd(Xr, init, tol=0.0)
    np.testing.assert_allclose(a.centers, b.centers, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.repeat(a.labels, w), b.labels)
    np.testing.assert_allclose(a.counts, b.counts)
    np.testing.assert_allclose(a.inertia, b.inertia, rtol=1e-10)


def test_lloyd_unit_weights_equal_no_weights():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(150, 3))
    init = X[:4].copy()
    a = lloyd(X, init, weights=np.ones(150), tol=0.0)
    b = lloyd(X, init, tol=0.0)
    np.testing.assert_allclose(a.centers, b.centers, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(a.labels, b.labels)


def test_lloyd_one_round_hand_computed():
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [10.0, 10.0], [11.0, 10.0], [4.0, 4.0]])
    init = np.array([[0.0, 0.0], [10.0, 10.0]])
    res = lloyd(X, init, max_iter=1)
    # assignment to init: [4,4] is nearer (0,0) (32 < 72)
    first = np.array([0, 0, 0, 1, 1, 0])
    expected = np.array([X[first == 0].mean(axis=0), X[first == 1].mean(axis=0)])
    np.testing.assert_allclose(res.centers, expected)
    np.testing.assert_allclose(expected, [[1.25, 1.25], [10.5, 10.0]])
    # returned labels and inertia are w.r.t. the returned centers
    ref = cdist(X, expected, "sqeuclidean")
    np.testing.assert_array_equal(res.labels, ref.argmin(axis=1))
    np.testing.assert_allclose(res.inertia, ref.min(axis=1).sum())
    np.testing.assert_allclose(res.counts, np.bincount(ref.argmin(axis=1), minlength=2))
    assert res.n_iter == 1


def test_lloyd_result_is_fixed_point():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(300, 3))
    res = lloyd(X, X[:7].copy(), tol=0.0, max_iter=1000)
    assert res.converged
    ref = cdist(X, res.centers, "sqeuclidean")
    np.testing.assert_array_equal(res.labels, ref.argmin(axis=1))
    for j in range(7):
        np.testing.assert_allclose(res.centers[j], X[res.labels == j].mean(axis=0), atol=1e-12)


def test_lloyd_float32_input():
    rng = np.random.default_rng(9)
    X = (5 * rng.normal(size=(200, 3))).astype(np.float32)
    res = lloyd(X, X[:3].copy())
    assert res.centers.dtype == np.float32
    assert np.isfinite(res.centers).all()
    ref = lloyd(X.astype(np.float64), X[:3].astype(np.float64))
    np.testing.assert_allclose(res.centers, ref.centers, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------ empty clusters

@pytest.mark.parametrize("weighted", [False, True])
def test_empty_cluster_relocated_no_nan(weighted):
    rng = np.random.default_rng(11)
    X = rng.normal(size=(60, 2))
    init = np.array([[0.0, 0.0], [1e6, 1e6], [0.0, 0.0], [-1e6, 3e6]])  # 3 start empty
    w = rng.uniform(0.5, 2.0, size=60) if weighted else None
    for max_iter in (1, 2, 300):
        res = lloyd(X, init, weights=w, max_iter=max_iter)
        assert np.isfinite(res.centers).all()
        assert (res.counts > 0).all(), res.counts
        assert np.abs(res.centers).max() < 100  # moved onto the data
        ref = cdist(X, res.centers, "sqeuclidean")
        np.testing.assert_array_equal(res.labels, ref.argmin(axis=1))


def test_empty_cluster_without_relocation_keeps_center():
    X = np.array([[0.0], [1.0], [2.0]])
    init = np.array([[1.0], [100.0]])
    res = lloyd(X, init, max_iter=5, relocate_empty=False)
    assert np.isfinite(res.centers).all()
    np.testing.assert_allclose(res.centers, [[1.0], [100.0]])
    np.testing.assert_allclose(res.counts, [3, 0])


def test_lloyd_constant_data_no_nan():
    X = np.ones((10, 3))
    res = lloyd(X, np.array([[1.0, 1, 1], [2.0, 2, 2], [1.0, 1, 1]]))
    assert np.isfinite(res.centers).all()
    assert res.inertia == pytest.approx(0.0, abs=1e-12)


# ------------------------------------------------------------------ k-means++

def test_kmeans_plusplus_distinct_and_reproducible():
    rng = np.random.default_rng(12)
    X = rng.normal(size=(300, 5))
    for k in (1, 2, 10, 50):
        a = kmeans_plusplus(X, k, np.random.default_rng(42))
        b = kmeans_plusplus(X, k, np.random.default_rng(42))
        assert a.shape == (k,)
        assert len(np.unique(a)) == k
        assert ((a >= 0) & (a < 300)).all()
        np.testing.assert_array_equal(a, b)
    runs = {tuple(kmeans_plusplus(X, 10, np.random.default_rng(s))) for s in range(5)}
    assert len(runs) > 1  # the seed matters


def test_kmeans_plusplus_k_equals_n_is_a_permutation():
    rng = np.random.default_rng(13)
    X = rng.normal(size=(12, 3))
    idx = kmeans_plusplus(X, 12, np.random.default_rng(0))
    assert sorted(idx.tolist()) == list(range(12))


def test_kmeans_plusplus_with_duplicates_distinct_indices():
    X = np.repeat(np.array([[0.0, 0.0], [5.0, 5.0]]), 5, axis=0)
    idx = kmeans_plusplus(X, 4, np.random.default_rng(0))
    assert len(np.unique(idx)) == 4
    assert {tuple(r) for r in X[idx[:2]]} == {(0.0, 0.0), (5.0, 5.0)}


def test_kmeans_plusplus_one_seed_per_separated_blob():
    rng = np.random.default_rng(14)
    means = 1000 * rng.normal(size=(6, 4))
    X, y = blobs(30, means, rng)
    for s in range(5):
        idx = kmeans_plusplus(X, 6, np.random.default_rng(s))
        assert sorted(y[idx].tolist()) == list(range(6))


def test_kmeans_plusplus_zero_weight_points_never_chosen():
    rng = np.random.default_rng(15)
    X = rng.normal(size=(100, 2))
    w = np.zeros(100)
    w[::3] = 1.0
    for s in range(5):
        idx = kmeans_plusplus(X, 8, np.random.default_rng(s), weights=w)
        assert (w[idx] > 0).all()
