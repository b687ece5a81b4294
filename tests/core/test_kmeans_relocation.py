"""Empty-cluster relocation, the stopping rules of ``lloyd`` and the k-means++ choices,
by hand and against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedclust.core.kmeans import assign, kmeans_plusplus, lloyd, relocate_empty_centers


def col(*v):
    return np.array(v, dtype=float)[:, None]


# ------------------------------------------------------------------ relocate_empty_centers
def test_relocation_skips_the_only_point_of_a_one_point_cluster():
    """X = [0, 0, 10], centers [0, 10, 100]: 10 is farthest from its old center but alone in
    its cluster, so the empty center takes the first 0 instead."""
    X = col(0, 0, 10)
    labels = np.array([0, 0, 1])
    counts = np.array([2.0, 1.0, 0.0])
    mind = np.array([0.0, 0.0, 36.0])
    centers, lab, cnt = relocate_empty_centers(X, labels.copy(), col(0, 10, 100), counts.copy(),
                                               mind, None)
    np.testing.assert_array_equal(lab, [2, 0, 1])
    np.testing.assert_array_equal(cnt, [1, 1, 1])
    np.testing.assert_array_equal(centers, col(0, 10, 0))


def test_relocation_takes_the_farthest_points_first_and_keeps_one_per_cluster():
    """Two empty centers, one cluster of two points and one of three: the empties take
    the farthest point of each cluster that still has another one."""
    X = col(0, 1, 9, 20, 21)
    labels = np.array([0, 0, 1, 1, 1])
    old = col(0.5, 11, 50, 60)
    mind = ((X - old[labels]) ** 2).ravel()        # 0.25 0.25 4 81 100
    counts = np.array([2.0, 3.0, 0.0, 0.0])
    centers, lab, cnt = relocate_empty_centers(X, labels.copy(), old.copy(), counts.copy(),
                                               mind, None)
    # order by distance: 21 (cluster 1, 3 points) -> center 2; 20 (cluster 1, now 2) ->
    # center 3; cluster 1 keeps 9
    np.testing.assert_array_equal(lab, [0, 0, 1, 3, 2])
    np.testing.assert_array_equal(cnt, [2, 1, 1, 1])
    np.testing.assert_allclose(centers, col(0.5, 9, 21, 20))


def test_relocation_never_empties_a_cluster_and_covers_every_center():
    """n >= k points (duplicates allowed): every cluster of the returned labels has a point,
    no cluster that had points loses its last one, and centers are the label means."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n, k = rng.integers(3, 12), rng.integers(2, 6)
        if n < k:
            continue
        X = rng.integers(0, 4, size=(n, 2)).astype(float)
        labels = rng.integers(0, k, n)
        labels[rng.random(n) < 0.5] = 0                 # crowd one cluster, empty others
        counts = np.bincount(labels, minlength=k).astype(float)
        if (counts > 0).all():
            continue
        C = rng.normal(size=(k, 2))
        mind = ((X - C[labels]) ** 2).sum(1)
        centers, lab, cnt = relocate_empty_centers(X, labels.copy(), C.copy(), counts.copy(),
                                                   mind, None)
        assert (cnt > 0).all()
        np.testing.assert_array_equal(cnt, np.bincount(lab, minlength=k))
        for j in range(k):
            np.testing.assert_allclose(centers[j], X[lab == j].mean(axis=0))
        moved = np.flatnonzero(lab != labels)
        assert len(moved) == int((counts == 0).sum())
        # points leave only clusters that keep another point; taken farthest first
        assert np.all(np.isin(lab[moved], np.flatnonzero(counts == 0)))


def test_weighted_relocation_moves_weight_and_weighted_means():
    X = col(0, 1, 10, 12)
    w = np.array([1.0, 3.0, 2.0, 2.0])
    labels = np.array([0, 0, 1, 1])
    counts = np.array([4.0, 4.0, 0.0])
    mind = ((X - col(0.75, 11)[labels]) ** 2).ravel()  # 0.5625 0.0625 1 1
    centers, lab, cnt = relocate_empty_centers(X, labels.copy(), col(0.75, 11, 99), counts.copy(),
                                               mind, w)
    # the first of the two farthest (10, stable order) leaves cluster 1 (weight 4 > 2)
    np.testing.assert_array_equal(lab, [0, 0, 2, 1])
    np.testing.assert_array_equal(cnt, [4, 2, 2])
    np.testing.assert_allclose(centers, col(0.75, 12, 10))
    # a point whose weight is its cluster's whole weight is never taken
    centers, lab, cnt = relocate_empty_centers(col(0, 5), np.array([0, 1]), col(0, 5, 9),
                                               np.array([1.0, 3.0, 0.0]),
                                               np.array([0.0, 4.0]), np.array([1.0, 3.0]))
    np.testing.assert_array_equal(lab, [0, 1])
    np.testing.assert_array_equal(cnt, [1, 3, 0])


# ------------------------------------------------------------------ lloyd
def test_duplicates_fewer_distinct_points_than_k_leave_a_center_empty():
    """X = [0, 0, 10], start [0, 4, 100]: two distinct points for k = 3; the documented
    outcome is weights (2, 1, 0) with the two points as centers and zero inertia."""
    res = lloyd(col(0, 0, 10), col(0, 4, 100))
    np.testing.assert_array_equal(res.counts, [2, 1, 0])
    np.testing.assert_array_equal(res.centers[:2], col(0, 10))
    assert res.inertia == 0.0 and np.isfinite(res.centers).all()


def test_at_least_k_distinct_points_every_center_gets_weight():
    rng = np.random.default_rng(1)
    runs = 0
    for _ in range(400):
        n, k, d = rng.integers(3, 12), rng.integers(2, 6), rng.integers(1, 3)
        X = rng.integers(0, 4, size=(n, d)).astype(float)
        if len(np.unique(X, axis=0)) < k:
            continue
        init = rng.integers(-3, 8, size=(k, d)).astype(float) * rng.choice([1, 10], size=(k, 1))
        res = lloyd(X, init, max_iter=300, tol=0.0)
        assert res.converged and (res.counts > 0).all(), (X.ravel(), init.ravel())
        runs += 1
    assert runs > 100


def test_n_equal_k_relocates_too():
    res = lloyd(col(0, 1, 2), col(0, 100, 200), max_iter=1)
    np.testing.assert_array_equal(np.sort(res.centers.ravel()), [0, 1, 2])
    np.testing.assert_array_equal(res.counts, [1, 1, 1])


def test_weighted_lloyd_relocation_uses_the_weights():
    """One round, weighted: the empty center takes the farthest point whose cluster keeps
    weight, and both clusters get their weighted means."""
    X = col(0, 1, 2, 10)
    w = np.array([3.0, 1.0, 1.0, 5.0])
    res = lloyd(X, col(1, 100), weights=w, max_iter=1)
    # round 1: all points -> center 0; center 1 is empty and takes 10 (farthest from 1);
    # center 0 becomes the weighted mean of 0, 1, 2: (0 + 1 + 2) / 5
    np.testing.assert_allclose(np.sort(res.centers.ravel()), [0.6, 10.0])
    np.testing.assert_allclose(np.sort(res.counts), [5.0, 5.0])


@pytest.mark.parametrize("tol", [1e-4, 1e-2, 0.3])
@pytest.mark.parametrize("seed", [0, 1])
def test_tolerance_stops_where_scikit_learn_does(tol, seed):
    """scikit-learn's rule: stop once the summed squared center shift is at most
    tol × the mean per-feature variance of X; defaults max_iter=300, tol=1e-4."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(m, 1.0, size=(60, 3)) for m in (0.0, 1.0, 2.5)])
    X[:, 2] *= 7.0                                   # unequal feature variances
    init = X[rng.choice(len(X), 3, replace=False)]
    ref = KMeans(3, init=init, n_init=1, tol=tol, algorithm="lloyd").fit(X)
    res = lloyd(X, init, tol=tol) if tol != 1e-4 else lloyd(X, init)
    np.testing.assert_allclose(res.centers, ref.cluster_centers_, rtol=0, atol=1e-10)
    assert res.converged


def test_one_feature_uses_its_variance_in_the_tolerance():
    rng = np.random.default_rng(6)
    X = np.concatenate([rng.normal(0, 1, 50), rng.normal(1.5, 1, 50)])[:, None] * 5.0
    init = X[:2].copy()
    for tol in (1e-3, 0.05, 0.3):
        ref = KMeans(2, init=init, n_init=1, tol=tol, algorithm="lloyd").fit(X)
        np.testing.assert_allclose(lloyd(X, init, tol=tol).centers, ref.cluster_centers_,
                                   rtol=0, atol=1e-10)


def test_cut_off_runs_say_they_did_not_converge():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 2))
    res = lloyd(X, X[:5].copy(), max_iter=1, tol=0.0)
    assert res.converged is False and res.n_iter == 1
    full = lloyd(X, X[:5].copy(), max_iter=300, tol=0.0)
    assert full.converged is True and full.n_iter > 1


def test_one_round_converged_flag_matches_the_eager_tolerance():
    # max_iter=1 works out the variance only when ``converged`` is read: same verdict and
    # same centers as with the variance given up front
    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 3))
    var = X.var(axis=0).mean()
    for init, tol in [(X[:4].copy(), 1e-4), (X[:4].copy(), 1e3), (X[:1].copy(), 0.0)]:
        lazy = lloyd(X, init, max_iter=1, tol=tol)
        eager = lloyd(X, init, max_iter=1, tol=tol, x_var=var)
        shift = ((eager.centers - init) ** 2).sum()
        assert lazy.converged is eager.converged is bool(shift <= tol * var)
        np.testing.assert_array_equal(lazy.centers, eager.centers)
        np.testing.assert_array_equal(lazy.labels, eager.labels)


def test_float32_data_with_float64_start_stays_float32():
    X = np.random.default_rng(7).normal(size=(40, 3)).astype(np.float32)
    res = lloyd(X, X[:3].astype(np.float64))
    assert res.centers.dtype == np.float32


def test_assign_distances_are_never_negative():
    """The BLAS expansion can round below 0 when a center sits on a point."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(500, 7)) * 1e3 + 1e4
    labels, mind = assign(X, X[:50])
    assert (mind >= 0).all()
    np.testing.assert_array_equal(labels[:50], np.arange(50))


# ------------------------------------------------------------------ kmeans_plusplus
class ScriptedRng:
    """A generator whose draws are given: the first center, then each step's candidates."""

    def __init__(self, first, candidates):
        self.first, self.candidates, self.sizes = first, list(candidates), []

    def choice(self, n, size=None, p=None):
        self.sizes.append(size)
        if size is None:
            return self.first
        return np.asarray(self.candidates.pop(0))


def test_kmeans_plusplus_keeps_the_candidate_that_lowers_the_potential_most():
    X = col(0, 1, 10, 11)
    rng = ScriptedRng(0, [[1, 3]])
    idx = kmeans_plusplus(X, 2, rng, n_local_trials=2)
    # with {0, 1}: 0 + 0 + 81 + 100; with {0, 11}: 0 + 1 + 1 + 0: candidate 3 wins
    np.testing.assert_array_equal(idx, [0, 3])


@pytest.mark.parametrize("k", [2, 3, 8, 20])
def test_kmeans_plusplus_draws_two_plus_log_k_candidates(k):
    X = np.random.default_rng(5).normal(size=(50, 2))
    rng = ScriptedRng(0, [[i] * (2 + int(np.log(k))) for i in range(1, k)])
    kmeans_plusplus(X, k, rng)
    assert rng.sizes == [None] + [2 + int(np.log(k))] * (k - 1)


def test_kmeans_plusplus_on_tiny_scales_still_samples_by_distance():
    """A potential below 1 is still a potential: the far point is chosen, not a duplicate."""
    X = col(0, 0, 0, 1e-3)
    for seed in range(10):
        idx = kmeans_plusplus(X, 2, np.random.default_rng(seed))
        assert sorted(X[idx, 0]) == [0.0, 1e-3]


def test_kmeans_plusplus_all_points_equal_takes_unused_rows_in_order():
    X = np.ones((5, 2))
    idx = kmeans_plusplus(X, 4, ScriptedRng(2, []))
    np.testing.assert_array_equal(idx, [2, 0, 1, 3])


def test_blocked_lloyd_on_integer_counts_is_its_float_weights_run():
    from fedclust.core.kmeans import blocked_lloyd, lloyd
    rng = np.random.default_rng(2)
    X = rng.normal(size=(5000, 3)) + rng.integers(0, 4, size=(5000, 1)) * 6.0
    counts = rng.integers(1, 30, size=5000)
    a = blocked_lloyd(X, X[:4], weights=counts, max_iter=50, block=333)
    b = blocked_lloyd(X, X[:4], weights=counts.astype(np.float64), max_iter=50, block=333)
    assert np.array_equal(a.centers, b.centers) and np.array_equal(a.labels, b.labels)
    assert a.inertia == b.inertia and a.labels.dtype == np.int8
    # and the whole-array Lloyd's partition and cost (an independent implementation)
    c = lloyd(X, X[:4], weights=counts.astype(np.float64), max_iter=50)
    assert np.array_equal(a.labels, c.labels)
    assert np.isclose(a.inertia, c.inertia, rtol=1e-10)
    d2 = ((X - a.centers[a.labels]) ** 2).sum(1)
    assert np.isclose(a.inertia, d2 @ counts, rtol=1e-10)
