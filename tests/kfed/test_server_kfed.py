"""k-FED server step: farthest-first + Lloyd, single linkage, first-device choice."""

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import cdist
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from conftest import sorted_rows
from fedclust import ValidationError
from fedclust.kfed.server import (aggregate_centers, assign_to_centers, farthest_first,
                                  single_linkage)


def _split(C, sizes):
    return np.split(C, np.cumsum(sizes)[:-1])


def _brute_farthest_first(C, k, start):
    chosen = list(start)
    while len(chosen) < k:
        D = cdist(C, C[chosen]).min(axis=1)
        D[chosen] = -1
        chosen.append(int(np.argmax(D)))
    return chosen


# ------------------------------------------------------------------ hand-checked

def test_hand_checked_1d_farthest_lloyd1():
    # device 0: {0, 10}, device 1: {1, 20}, device 2: {12, 21}
    centers = [np.array([[0.0], [10.0]]), np.array([[1.0], [20.0]]),
               np.array([[12.0], [21.0]])]
    res = aggregate_centers(centers, 3)
    # "widest": all have 2 centers; device 1 has the largest own spread (19)
    assert res.seed_device == 1
    # M = {1, 20}; min distances: 0->1, 10->9, 12->8, 21->1 => add 10.
    # One Lloyd round: {0,1} -> 0.5, {20,21} -> 20.5, {10,12} -> 11
    np.testing.assert_allclose(res.centers, [[0.5], [20.5], [11.0]])
    assert [c.tolist() for c in res.center_labels] == [[0, 2], [0, 1], [2, 1]]
    assert res.n_iter == 1


def test_hand_checked_one_round_vs_convergence():
    # 1-D, k = 2: seed device {0, 2} (so M = {0, 2}); other device {3, 4, 100}.
    centers = [np.array([[0.0], [2.0]]), np.array([[3.0], [4.0], [100.0]])]
    one = aggregate_centers(centers, 2, method="farthest-lloyd1", first_device=0)
    # round 1: {0} -> 0 ; {2, 3, 4, 100} -> 27.25
    np.testing.assert_allclose(one.centers, [[0.0], [27.25]])
    assert [c.tolist() for c in one.center_labels] == [[0, 0], [0, 0, 1]]  # w.r.t. final
    full = aggregate_centers(centers, 2, method="farthest-lloyd", first_device=0, tol=0.0)
    # round 2: {0, 2, 3, 4} -> 2.25 ; {100} -> 100 ; round 3: stable
    np.testing.assert_allclose(full.centers, [[2.25], [100.0]])
    assert [c.tolist() for c in full.center_labels] == [[0, 0], [0, 0, 1]]
    assert full.n_iter == 2


def test_hand_checked_2d_farthest_first_adds_points():
    # seed device has 1 center, k = 3: two farthest-first steps
    centers = [np.array([[0.0, 0.0]]),
               np.array([[10.0, 0.0], [0.0, 3.0]]),
               np.array([[9.0, 1.0], [1.0, 3.0]])]
    res = aggregate_centers(centers, 3, first_device=0)
    # from (0,0): farthest is (10,0) (d=10); then min-dists: (0,3)->3, (9,1)->1.41, (1,3)->3.16
    # => (1,3). M = {(0,0), (10,0), (1,3)}.
    # Round: (0,0)->M0; (10,0),(9,1)->M1; (0,3),(1,3)->M2
    np.testing.assert_allclose(res.centers, [[0.0, 0.0], [9.5, 0.5], [0.5, 3.0]])
    assert [c.tolist() for c in res.center_labels] == [[0], [1, 2], [1, 2]]


# ------------------------------------------------------------------ farthest first

@pytest.mark.parametrize("n_start", [1, 2, 3])
def test_farthest_first_matches_brute_force(n_start):
    rng = np.random.default_rng(0)
    C = rng.normal(size=(60, 4))
    start = np.arange(5, 5 + n_start)
    got = farthest_first(C, 12, start=start)
    assert got.tolist() == _brute_farthest_first(C, 12, list(start))
    assert len(set(got.tolist())) == 12


def test_farthest_first_start_larger_than_k():
    rng = np.random.default_rng(1)
    C = rng.normal(size=(30, 3))
    start = np.arange(10, 20)
    got = farthest_first(C, 4, start=start)
    assert set(got.tolist()) <= set(start.tolist())
    sub = _brute_farthest_first(C[start], 4, [0])
    assert got.tolist() == start[sub].tolist()


def test_farthest_first_k_equals_start_keeps_all():
    C = np.random.default_rng(2).normal(size=(10, 2))
    got = farthest_first(C, 3, start=np.array([4, 5, 6]))
    assert sorted(got.tolist()) == [4, 5, 6]


def test_farthest_first_k_one():
    # k = 1 must return the first start row (used by KFed(n_clusters=1))
    C = np.random.default_rng(3).normal(size=(6, 2))
    assert farthest_first(C, 1, start=np.array([2])).tolist() == [2]
    assert farthest_first(C, 1, start=np.array([2, 3])).tolist() == [2]


@pytest.mark.parametrize("method", ["farthest-lloyd1", "farthest-lloyd", "single-linkage"])
def test_aggregate_single_cluster(method):
    rng = np.random.default_rng(4)
    centers = [rng.normal(size=(3, 2)), rng.normal(size=(2, 2))]
    res = aggregate_centers(centers, 1, method=method)
    np.testing.assert_allclose(res.centers[0], np.concatenate(centers).mean(axis=0))
    assert all((lab == 0).all() for lab in res.center_labels)


# ------------------------------------------------------------------ single linkage

@pytest.mark.parametrize("seed,k", [(0, 5), (1, 12), (2, 2)])
def test_single_linkage_matches_scipy(seed, k):
    rng = np.random.default_rng(seed)
    C = np.concatenate([rng.normal(size=(40, 3)) + 6 * rng.normal(size=3) for _ in range(5)])
    ours = single_linkage(C, k)
    ref = fcluster(linkage(C, method="single"), t=k, criterion="maxclust")
    assert len(np.unique(ours)) == k
    assert sorted(np.unique(ours).tolist()) == list(range(k))
    assert adjusted_rand_score(ref, ours) == 1.0


def test_single_linkage_uniform_random_matches_scipy():
    C = np.random.default_rng(5).uniform(size=(200, 2))
    for k in (3, 10, 50):
        ours = single_linkage(C, k)
        ref = fcluster(linkage(C, method="single"), t=k, criterion="maxclust")
        assert adjusted_rand_score(ref, ours) == 1.0


def test_single_linkage_aggregate_centers_are_means():
    rng = np.random.default_rng(6)
    C = rng.normal(size=(50, 2))
    cnt = rng.integers(1, 10, size=50)
    parts = _split(C, [20, 30])
    res = aggregate_centers(parts, 4, method="single-linkage")
    labels = np.concatenate(res.center_labels)
    ref = fcluster(linkage(C, method="single"), t=4, criterion="maxclust")
    assert adjusted_rand_score(ref, labels) == 1.0
    for j in range(4):
        np.testing.assert_allclose(res.centers[j], C[labels == j].mean(axis=0))
    resw = aggregate_centers(parts, 4, method="single-linkage", weighted=True,
                             counts=_split(cnt, [20, 30]))
    for j in range(4):
        m = labels == j
        np.testing.assert_allclose(resw.centers[j], (C[m] * cnt[m, None]).sum(0) / cnt[m].sum())


def test_single_linkage_k_at_least_n():
    C = np.random.default_rng(7).normal(size=(5, 2))
    assert sorted(single_linkage(C, 5).tolist()) == list(range(5))


# ------------------------------------------------------------------ Lloyd variants

def test_farthest_lloyd_is_fixed_point():
    rng = np.random.default_rng(8)
    parts = [rng.normal(size=(int(s), 3)) for s in rng.integers(2, 6, size=30)]
    res = aggregate_centers(parts, 7, method="farthest-lloyd", tol=0.0, max_iter=1000)
    C = np.concatenate(parts)
    labels = np.concatenate(res.center_labels)
    np.testing.assert_array_equal(labels, cdist(C, res.centers, "sqeuclidean").argmin(axis=1))
    for j in range(7):
        np.testing.assert_allclose(res.centers[j], C[labels == j].mean(axis=0), atol=1e-12)


def test_farthest_lloyd_matches_sklearn_from_farthest_init():
    rng = np.random.default_rng(9)
    parts = [rng.normal(size=(4, 2)) for _ in range(25)]
    C = np.concatenate(parts)
    init = C[_brute_farthest_first(C, 6, [0, 1, 2, 3])]
    res = aggregate_centers(parts, 6, method="farthest-lloyd", first_device=0, tol=0.0)
    km = KMeans(6, init=init, n_init=1, algorithm="lloyd", tol=0.0).fit(C)
    np.testing.assert_allclose(res.centers, km.cluster_centers_, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.concatenate(res.center_labels), km.labels_)
    res1 = aggregate_centers(parts, 6, method="farthest-lloyd1", first_device=0)
    km1 = KMeans(6, init=init, n_init=1, algorithm="lloyd", max_iter=1).fit(C)
    np.testing.assert_allclose(res1.centers, km1.cluster_centers_, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["farthest-lloyd1", "farthest-lloyd"])
def test_weighted_equals_repeated_centers(method):
    rng = np.random.default_rng(10)
    sizes = [3, 4, 2, 5, 3]
    C = rng.normal(size=(sum(sizes), 2))
    cnt = rng.integers(1, 6, size=len(C))
    res = aggregate_centers(_split(C, sizes), 4, counts=_split(cnt, sizes), weighted=True,
                            method=method, first_device=0, tol=0.0)
    # independent reference: farthest-first init (weights play no part), then Lloyd over
    # every center repeated count times
    init = C[_brute_farthest_first(C, 4, [0, 1, 2])]
    km = KMeans(4, init=init, n_init=1, algorithm="lloyd", tol=0.0,
                max_iter=1 if method == "farthest-lloyd1" else 300).fit(np.repeat(C, cnt, axis=0))
    np.testing.assert_allclose(res.centers, km.cluster_centers_, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.repeat(np.concatenate(res.center_labels), cnt), km.labels_)


def test_unweighted_ignores_counts():
    rng = np.random.default_rng(11)
    parts = [rng.normal(size=(3, 2)) for _ in range(4)]
    cnts = [rng.integers(1, 100, size=3) for _ in range(4)]
    a = aggregate_centers(parts, 3, counts=cnts, weighted=False)
    b = aggregate_centers(parts, 3)
    np.testing.assert_array_equal(a.centers, b.centers)


def test_weighted_without_counts_raises():
    with pytest.raises(ValidationError, match="counts"):
        aggregate_centers([np.zeros((2, 2)), np.ones((2, 2))], 2, weighted=True)


# ------------------------------------------------------------------ errors / first device

def test_too_few_centers_names_numbers():
    parts = [np.zeros((2, 3)), np.ones((1, 3))]
    with pytest.raises(ValidationError) as exc:
        aggregate_centers(parts, 5)
    text = str(exc.value)
    assert "3" in text and "n_clusters=5" in text and "2 devices" in text


def test_bad_method():
    parts = [np.random.default_rng(0).normal(size=(3, 2))]
    with pytest.raises(ValidationError, match="nope"):
        aggregate_centers(parts, 2, method="nope")


@pytest.mark.parametrize("k", [0, -1])
def test_bad_k(k):
    parts = [np.random.default_rng(0).normal(size=(3, 2))]
    with pytest.raises(ValidationError, match="n_clusters"):
        aggregate_centers(parts, k)


def test_first_device_choices():
    rng = np.random.default_rng(12)
    parts = [rng.normal(size=(2, 2)), rng.normal(size=(4, 2)), rng.normal(size=(3, 2))]
    assert aggregate_centers(parts, 3).seed_device == 1  # most centers
    for z in range(3):
        res = aggregate_centers(parts, 5, first_device=z)
        assert res.seed_device == z
        C = np.concatenate(parts)
        offs = np.cumsum([0, 2, 4, 3])
        start = list(range(offs[z], offs[z + 1]))
        init = (_brute_farthest_first(C, 5, start) if len(start) < 5 else None)
        if init is not None:
            km = KMeans(5, init=C[init], n_init=1, max_iter=1).fit(C)
            np.testing.assert_allclose(res.centers, km.cluster_centers_, atol=1e-12)
    expect = int(np.random.default_rng(99).integers(3))
    res = aggregate_centers(parts, 3, first_device="random", rng=np.random.default_rng(99))
    assert res.seed_device == expect
    with pytest.raises(ValidationError, match="rng"):
        aggregate_centers(parts, 3, first_device="random")
    with pytest.raises(ValidationError, match="first_device=3"):
        aggregate_centers(parts, 3, first_device=3)
    with pytest.raises(ValidationError, match="first_device"):
        aggregate_centers(parts, 3, first_device="biggest")


def test_widest_independent_of_device_order():
    rng = np.random.default_rng(13)
    parts = [rng.normal(size=(s, 3)) for s in (3, 5, 5, 2, 4)]
    base = aggregate_centers(parts, 6)
    perm = [3, 0, 4, 2, 1]
    res = aggregate_centers([parts[i] for i in perm], 6)
    assert perm[res.seed_device] == base.seed_device
    np.testing.assert_allclose(sorted_rows(res.centers), sorted_rows(base.centers), atol=1e-12)


def test_assign_to_centers_nearest():
    rng = np.random.default_rng(14)
    F = rng.normal(size=(5, 3))
    L = rng.normal(size=(9, 3))
    np.testing.assert_array_equal(assign_to_centers(L, F), cdist(L, F).argmin(axis=1))


@pytest.mark.parametrize("method", ["farthest-lloyd1", "farthest-lloyd", "single-linkage"])
def test_methods_recover_separated_groups(method):
    rng = np.random.default_rng(15)
    means = 50 * rng.normal(size=(6, 4))
    parts, truth = [], []
    for z in range(12):
        comps = rng.choice(6, size=3, replace=False)
        parts.append(means[comps] + 0.1 * rng.normal(size=(3, 4)))
        truth.append(comps)
    res = aggregate_centers(parts, 6, method=method)
    assert adjusted_rand_score(np.concatenate(truth), np.concatenate(res.center_labels)) == 1.0
    assert [len(c) for c in res.center_labels] == [3] * 12


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_farthest_first_is_scale_invariant(scale):
    """Picking the farthest point does not depend on the units: points closer than 1 to
    each other are chosen exactly as at scale 1 (and never twice)."""
    C = np.random.default_rng(3).normal(size=(30, 2))
    ref = farthest_first(C, 6, start=np.array([4]))
    got = farthest_first(C * scale, 6, start=np.array([4]))
    np.testing.assert_array_equal(got, ref)
    assert len(set(got.tolist())) == 6


def test_weighted_kmeanspp_server_ends_at_weighted_means():
    """Weighted server: every global center is the count-weighted mean of the local
    centers assigned to it (a fixed point of weighted Lloyd), not their plain mean."""
    rng = np.random.default_rng(5)
    means = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
    centers = [means + rng.normal(size=(3, 2)) for _ in range(6)]
    counts = [rng.integers(1, 50, size=3) for _ in range(6)]
    res = aggregate_centers(centers, 3, counts=counts, method="kmeans++", weighted=True,
                            rng=np.random.default_rng(0))
    C, w = np.concatenate(centers), np.concatenate(counts).astype(float)
    lab = cdist(C, res.centers).argmin(axis=1)
    for j in range(3):
        np.testing.assert_allclose(res.centers[j], (w[lab == j] @ C[lab == j]) / w[lab == j].sum(),
                                   atol=1e-10)
        assert np.abs(res.centers[j] - C[lab == j].mean(axis=0)).max() > 1e-3
