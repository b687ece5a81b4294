"""k-FED's device step (Awasthi–Sheffet local k-means)."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from conftest import blobs
from fedclust import ValidationError
from fedclust.kfed.local import (_spectral_seed, local_kmeans,
                                            top_right_singular_vectors)
from fedclust.kfed.messages import LocalCenters


def _separable(seed=0, k=4, d=20, n_per=50, sep=10.0):
    rng = np.random.default_rng(seed)
    means = sep * rng.normal(size=(k, d))
    return blobs(n_per, means, rng)


def _assert_lloyd_fixed_point(X, centers, labels):
    ref = cdist(X, centers, "sqeuclidean")
    np.testing.assert_array_equal(labels, ref.argmin(axis=1))
    for j in range(len(centers)):
        np.testing.assert_allclose(centers[j], X[labels == j].mean(axis=0), rtol=1e-10,
                                   atol=1e-10)


def test_recovers_separable_blobs():
    X, y = _separable()
    res = local_kmeans(X, 4, np.random.default_rng(0))
    assert isinstance(res.message, LocalCenters)
    assert res.message.centers.shape == (4, 20)
    assert adjusted_rand_score(y, res.labels) == 1.0
    assert not res.raw_points
    _assert_lloyd_fixed_point(X, res.message.centers, res.labels)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_sklearn_lloyd_from_same_init(seed):
    # messier data (overlapping blobs) so that Lloyd actually iterates
    X, _ = _separable(seed=seed, k=5, d=8, n_per=40, sep=1.5)
    theta = _spectral_seed(X, 5, np.random.default_rng(seed), project=True)
    res = local_kmeans(X, 5, np.random.default_rng(seed), tol=1e-4)
    km = KMeans(5, init=theta, n_init=1, algorithm="lloyd", tol=1e-4, max_iter=300).fit(X)
    np.testing.assert_array_equal(res.labels, km.labels_)
    np.testing.assert_allclose(res.message.centers, km.cluster_centers_, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(res.message.counts, np.bincount(km.labels_, minlength=5))


def test_fixed_point_on_messy_data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 6))
    res = local_kmeans(X, 6, np.random.default_rng(1), tol=0.0, max_iter=1000)
    _assert_lloyd_fixed_point(X, res.message.centers, res.labels)


def test_counts_sum_to_n_and_match_labels():
    X, _ = _separable(seed=4, k=3, d=5, n_per=37)
    res = local_kmeans(X, 3, np.random.default_rng(0))
    c = res.message.counts
    assert c.dtype == np.int64
    assert c.sum() == len(X)
    np.testing.assert_array_equal(c, np.bincount(res.labels, minlength=3))
    assert (c >= 1).all()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_too_few_points_refused(n):
    X = np.random.default_rng(0).normal(size=(n, 4))
    with pytest.raises(ValidationError) as exc:
        local_kmeans(X, 3, np.random.default_rng(0), device="device 7")
    text = str(exc.value)
    assert "device 7" in text and "allow_raw_points" in text and f"n_z={n}" in text


def test_too_few_points_allowed_sends_raw_points():
    X = np.random.default_rng(0).normal(size=(3, 4))
    res = local_kmeans(X, 5, np.random.default_rng(0), allow_raw_points=True)
    assert res.raw_points
    np.testing.assert_array_equal(res.message.centers, X)
    np.testing.assert_array_equal(res.message.counts, np.ones(3))
    np.testing.assert_array_equal(res.labels, np.arange(3))
    # must not alias the device's array
    X[0, 0] = 99.0
    assert res.message.centers[0, 0] != 99.0


@pytest.mark.parametrize("d", [1, 2, 3])
def test_d_smaller_than_k_skips_projection(d):
    rng = np.random.default_rng(5)
    means = 20 * rng.normal(size=(4, d))
    X, y = blobs(30, means, rng)
    res = local_kmeans(X, 4, np.random.default_rng(0))
    assert res.message.centers.shape == (4, d)
    assert np.isfinite(res.message.centers).all()
    _assert_lloyd_fixed_point(X, res.message.centers, res.labels)


def test_reproducible_from_same_seed():
    X, _ = _separable(seed=6, k=5, d=30, n_per=20, sep=2.0)
    a = local_kmeans(X, 5, np.random.default_rng(123))
    b = local_kmeans(X, 5, np.random.default_rng(123))
    np.testing.assert_array_equal(a.message.centers, b.message.centers)
    np.testing.assert_array_equal(a.message.counts, b.message.counts)
    np.testing.assert_array_equal(a.labels, b.labels)


def test_float32_input():
    X, y = _separable(seed=7)
    res = local_kmeans(X.astype(np.float32), 4, np.random.default_rng(0))
    assert res.message.centers.dtype == np.float32
    assert adjusted_rand_score(y, res.labels) == 1.0
    assert res.message.counts.sum() == len(X)
    back = LocalCenters.from_arrays(res.message.to_arrays(), sender="d")
    assert back.centers.dtype == np.float32


def test_k_equals_one_is_the_mean():
    X = np.random.default_rng(8).normal(size=(50, 3))
    res = local_kmeans(X, 1, np.random.default_rng(0))
    np.testing.assert_allclose(res.message.centers[0], X.mean(axis=0), atol=1e-12)
    assert res.message.counts.tolist() == [50]


def test_fewer_distinct_points_than_k_raises():
    X = np.repeat(np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), 10, axis=0)
    with pytest.raises(ValidationError, match="device 3"):
        local_kmeans(X, 3, np.random.default_rng(0), device="device 3")


@pytest.mark.parametrize("bad,frag", [(np.array([[1.0, np.nan], [0.0, 1.0], [2.0, 2.0]]), "nan"),
                                      (np.zeros(5), "2-D")])
def test_bad_device_array_named(bad, frag):
    with pytest.raises(ValidationError) as exc:
        local_kmeans(bad, 1, np.random.default_rng(0), device="device 4")
    assert "device 4" in str(exc.value) and frag in str(exc.value)


@pytest.mark.parametrize("shape,k", [((200, 10), 3), ((8, 30), 3), ((600, 500), 5)])
def test_top_right_singular_vectors_span(shape, k):
    rng = np.random.default_rng(9)
    # low rank + small noise: the top-k subspace is well defined
    A = rng.normal(size=(shape[0], k)) @ (10 * rng.normal(size=(k, shape[1])))
    A += 0.01 * rng.normal(size=shape)
    V = top_right_singular_vectors(A, k, np.random.default_rng(0))
    assert V.shape == (shape[1], k)
    _, _, Vt = np.linalg.svd(A, full_matrices=False)
    P_ref = Vt[:k].T @ Vt[:k]
    np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-6)
    np.testing.assert_allclose(V @ V.T, P_ref, atol=1e-5)


def test_spectral_seed_no_nan_when_filter_sets_empty():
    # uniform data: the 1/3 filter leaves some S_r empty; theta must stay finite
    rng = np.random.default_rng(10)
    X = rng.uniform(size=(40, 6))
    for s in range(5):
        theta = _spectral_seed(X, 5, np.random.default_rng(s), project=True)
        assert theta.shape == (5, 6)
        assert np.isfinite(theta).all()
