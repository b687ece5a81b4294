"""Kernels for many device centers: blocked weighted Lloyd, lightweight coreset seeding."""

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedclust.core.kmeans import (blocked_lloyd, lightweight_coreset, lloyd, weighted_kmeans)


def _blobs(n, k, d, seed):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=10, size=(k, d))
    return means[rng.integers(0, k, n)] + rng.normal(size=(n, d)), means


@pytest.mark.parametrize("weighted", [False, True])
def test_blocked_lloyd_equals_lloyd(weighted):
    X, _ = _blobs(5000, 6, 4, 0)
    w = np.random.default_rng(1).integers(1, 20, len(X)).astype(float) if weighted else None
    init = X[:6].copy()
    a = lloyd(X, init, weights=w, max_iter=50, tol=0.0, relocate_empty=False)
    b = blocked_lloyd(X, init, weights=w, max_iter=50, tol=0.0, block=333)
    np.testing.assert_allclose(b.centers, a.centers, rtol=1e-10, atol=1e-10)
    assert np.array_equal(a.labels, b.labels)
    assert b.inertia == pytest.approx(a.inertia, rel=1e-10)
    np.testing.assert_allclose(b.counts, a.counts)


def test_integer_weights_equal_repeated_rows():
    X, _ = _blobs(400, 3, 2, 3)
    w = np.random.default_rng(0).integers(1, 4, len(X))
    rep = np.repeat(X, w, axis=0)
    init = X[[0, 1, 2]]
    a = blocked_lloyd(X, init, weights=w, max_iter=30, tol=0.0)
    b = blocked_lloyd(rep, init, max_iter=30, tol=0.0)
    np.testing.assert_allclose(a.centers, b.centers, rtol=1e-10)
    assert a.inertia == pytest.approx(b.inertia, rel=1e-9)


def test_lightweight_coreset_estimates_cost_without_bias():
    X, means = _blobs(20000, 5, 3, 4)
    w = np.random.default_rng(5).random(len(X)) + 0.5
    Q = means + 0.5
    true = float(((X[:, None, :] - Q[None]) ** 2).sum(-1).min(1) @ w)
    ests = []
    for s in range(30):
        idx, cw = lightweight_coreset(X, 2000, np.random.default_rng(s), weights=w)
        ests.append(float(((X[idx][:, None, :] - Q[None]) ** 2).sum(-1).min(1) @ cw))
        assert cw.sum() == pytest.approx(w.sum(), rel=0.2)
    assert np.mean(ests) == pytest.approx(true, rel=0.02)


def test_weighted_kmeans_on_a_coreset_matches_sklearn_cost():
    X, _ = _blobs(60000, 20, 5, 6)
    res = weighted_kmeans(X, 20, np.random.default_rng(0), sample_size=3000)
    km = KMeans(20, n_init=3, random_state=0).fit(X)
    assert res.inertia <= 1.02 * km.inertia_
    assert res.centers.shape == (20, 5) and len(res.labels) == len(X)
