"""The device step's and the server's shortcuts against independent references: the
k-means++ first pick and potential test, the nearest and second nearest seed or center
(column by column), the (masked) one-hot means, the squared norms the
server shares between farthest-first and Lloyd, and the validation's all-finite fast path."""

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.validation import check_devices
from fedclust.kfed.batched import (_SEARCH_MIN_N, _inverse_cdf, _means, _start_basis,
                                   _two_nearest, kmeanspp_batch, n_uniforms,
                                   spectral_seed_batch)
from fedclust.kfed.server import aggregate_centers, farthest_first


@pytest.mark.parametrize("n", [1, 7, 20, 127, 128, 300])
def test_kmeanspp_first_pick_is_the_inverse_cdf_of_a_uniform(n):
    # a per-device binary search over the running sums 1..n, at u n; uniforms on the
    # cell edges j / n (an exact product) and just below 1 included
    rng = np.random.default_rng(n)
    u = np.concatenate([rng.random(40), np.arange(n) / n, [1 - 2**-53, 0.0]])
    P = rng.normal(size=(len(u), n, 2))
    U = np.zeros((len(u), n_uniforms(1)))
    U[:, 0] = u
    got = kmeanspp_batch(P, 1, U)[:, 0]
    ref = [min(int(np.searchsorted(np.arange(1.0, n + 1), ui * n, side="right")), n - 1)
           for ui in u]
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_kmeanspp_on_a_device_of_fewer_distinct_points_than_k(k):
    # every point of device 0 is one point (potential 0 from the first pick), device 1 has
    # two distinct points: the seeds are k distinct rows, and device 2 (ordinary) seeds
    # as it does alone
    rng = np.random.default_rng(k)
    P = rng.normal(size=(3, 12, 2))
    P[0] = 1.5
    P[1, :6], P[1, 6:] = 0.0, 4.0
    U = rng.random((3, n_uniforms(k)))
    idx, near, d1, d2 = kmeanspp_batch(P, k, U, nearest=True)
    assert all(len(set(row)) == k for row in idx.tolist())
    np.testing.assert_array_equal(idx[2], kmeanspp_batch(P[2:], k, U[2:])[0])
    np.testing.assert_array_equal(d1[0], 0.0)
    np.testing.assert_array_equal(d2[0], 0.0)   # a second seed on the same point: a tie
    for b in range(3):   # the two nearest seeds against the distances computed afresh
        D = ((P[b][:, None, :] - P[b][idx[b]][None]) ** 2).sum(axis=2)
        S = np.sort(D, axis=1)
        np.testing.assert_allclose(d1[b], S[:, 0], atol=1e-12)
        np.testing.assert_allclose(d2[b], S[:, 1], atol=1e-12)
        np.testing.assert_allclose(D[np.arange(len(D)), near[b]], S[:, 0], atol=1e-12)


def test_kmeanspp_single_candidate_follows_the_potential():
    # k = 2 with one far point: the second seed is drawn proportionally to the squared
    # distances, so a uniform past the near points' share lands on the far point
    P = np.zeros((1, 10, 1))
    P[0, 9] = 10.0
    U = np.zeros((1, n_uniforms(2)))
    U[0, 0] = 0.0            # first seed: row 0 (a near point)
    U[0, 1:] = 0.5           # every candidate draw: half the potential, all on row 9
    assert kmeanspp_batch(P, 2, U)[0].tolist() == [0, 9]


@pytest.mark.parametrize("k", [2, 5, 12])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kmeanspp_nearest_seed_is_the_first_closest_exactly(k, dtype):
    # small integer coordinates: every squared distance is an exact integer in either
    # precision, so the tracked nearest seed (the first of equals, as argmin) and the two
    # smallest distances are compared exactly; repeated points tie seeds
    rng = np.random.default_rng(k)
    P = rng.integers(-4, 5, size=(4, 60, 3)).astype(dtype)
    U = rng.random((4, n_uniforms(k)))
    idx, near, d1, d2 = kmeanspp_batch(P, k, U, nearest=True)
    assert near.dtype == np.int64 and d1.dtype == d2.dtype == dtype
    for b in range(4):
        D = ((P[b][:, None, :] - P[b][idx[b]][None]) ** 2).sum(axis=2)     # (n, k)
        S = np.sort(D, axis=1)
        np.testing.assert_array_equal(near[b], D.argmin(axis=1))
        np.testing.assert_array_equal(d1[b], S[:, 0])
        np.testing.assert_array_equal(d2[b], S[:, 1])


@pytest.mark.parametrize("n", [1, _SEARCH_MIN_N - 1, _SEARCH_MIN_N, _SEARCH_MIN_N + 1, 300])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inverse_cdf_is_a_binary_search_of_the_running_sums(n, dtype):
    # zero weights (runs of equal sums), uniforms 0 and just below 1, and thresholds on a
    # running sum exactly (u = 1/2 of an even integer total): the index of the first sum
    # above u * total, as searchsorted(side="right"), clipped to the last row
    rng = np.random.default_rng(n)
    p = rng.integers(0, 4, size=(6, n)).astype(dtype)
    p[0] = 0.0
    p[1, : n // 2] = 0.0
    p[2] = 2.0
    u = rng.random((6, 5))
    u[:, 0], u[:, 1], u[:, 2] = 0.0, 1 - 2**-24, 0.5
    got = _inverse_cdf(p, u)
    cum = np.cumsum(p, axis=1)
    ref = [[min(int(np.searchsorted(c, ui * c[-1], side="right")), n - 1) for ui in row]
           for c, row in zip(cum, u)]
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == np.int64 and got.shape == (6, 5)


def _two_nearest_rows(D, nearest):
    """numpy's row reductions: argmin, the value there, the smallest of the others."""
    D = D.copy()
    if nearest is None:
        nearest = D.argmin(axis=2)
    own = np.take_along_axis(D, nearest[:, :, None], axis=2)[:, :, 0]
    np.put_along_axis(D, nearest[:, :, None], np.inf, axis=2)
    return nearest, own, D.min(axis=2)


@pytest.mark.parametrize("k", [2, 4, 5, 6, 10, 17])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("given", [False, True])
def test_two_nearest_matches_row_reductions(k, dtype, given):
    # integers: many ties (the first one is the nearest, its equal the second); rows of inf
    rng = np.random.default_rng(k)
    D = rng.integers(-3, 4, size=(5, 40, k)).astype(dtype)
    D[1, :4] = np.inf
    D[2, :3, 0] = np.inf
    D[3] = rng.normal(size=(40, k))
    nearest = D.argmin(axis=2) if given else None
    got = _two_nearest(D.copy(), None if nearest is None else nearest.copy())
    for g, r in zip(got, _two_nearest_rows(D, nearest)):
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(g, r)
    S = np.sort(D, axis=2)   # and against a sort
    np.testing.assert_array_equal(got[1], S[:, :, 0])
    np.testing.assert_array_equal(got[2], S[:, :, 1])


def test_subspace_start_basis_is_shared_read_only():
    S = _start_basis(7, 3)
    assert _start_basis(7, 3) is S and not S.flags.writeable
    assert set(np.unique(S)) == {-1.0, 1.0} and S.shape == (7, 3)
    assert np.linalg.matrix_rank(S) == 3
    with pytest.raises(ValueError):
        S[0, 0] = 0.0


def _means_loop(X, labels, k, mask=None):
    """Per device, per label: sums with np.add.at and counts with np.bincount."""
    B, n, d = X.shape
    sums, counts = np.zeros((B, k, d)), np.zeros((B, k))
    for b in range(B):
        keep = np.ones(n, dtype=bool) if mask is None else mask[b]
        np.add.at(sums[b], labels[b][keep], X[b][keep])
        counts[b] = np.bincount(labels[b][keep], minlength=k)
    return sums, counts


@pytest.mark.parametrize("masked", [False, True])
def test_means_equal_a_per_device_loop(masked):
    # integer data: every sum is exact, so the one-hot product and the loop agree bit for bit;
    # an empty label and a device with everything masked out included
    rng = np.random.default_rng(4)
    X = rng.integers(-50, 50, size=(5, 30, 4)).astype(float)
    labels = rng.integers(0, 4, size=(5, 30))
    labels[1] = 0                                    # labels 1..3 empty on device 1
    mask = rng.random((5, 30)) < 0.6 if masked else None
    if masked:
        mask[2] = False
    sums, counts = _means(X, labels, 4, mask)
    ref_sums, ref_counts = _means_loop(X, labels, 4, mask)
    np.testing.assert_array_equal(sums, ref_sums)
    np.testing.assert_array_equal(counts, ref_counts)
    assert sums.dtype == counts.dtype == X.dtype


def test_filtered_seeds_are_means_of_the_points_a_third_closer():
    # Algorithm 1's step 3 against a per-device loop: the points at least 3x closer to
    # their nearest seed than to every other one (projected), their mean in the full space
    rng = np.random.default_rng(9)
    centers = 30.0 * rng.normal(size=(3, 6))
    X = np.stack([np.concatenate([c + rng.normal(size=(40, 6)) for c in centers])
                  for _ in range(4)])
    U = rng.random((4, n_uniforms(3)))
    theta = spectral_seed_batch(X, 3, U, project=False)
    idx = kmeanspp_batch(X, 3, U)
    for b in range(4):
        D = ((X[b][:, None, :] - X[b][idx[b]][None]) ** 2).sum(axis=2)
        S = np.sort(D, axis=1)
        keep = 9.0 * S[:, 0] <= S[:, 1]
        near = D.argmin(axis=1)
        ref = np.stack([X[b][keep & (near == r)].mean(axis=0) for r in range(3)])
        np.testing.assert_allclose(theta[b], ref, rtol=1e-12, atol=1e-9)


def _farthest_first_reference(C, k, start):
    """Gonzalez from scratch: distances to the chosen set recomputed at every step."""
    chosen = list(start)
    while len(chosen) < k:
        D = ((C[:, None, :] - C[chosen][None]) ** 2).sum(axis=2).min(axis=1)
        D[chosen] = -1.0
        chosen.append(int(np.argmax(D)))
    return chosen


def test_server_squared_norms_shared_give_the_reference_server():
    # farthest-first with the norms passed equals it without them, and equals a traversal
    # recomputed from scratch on well-separated centers; one Lloyd step from there gives
    # the means of the nearest-seed groups (scikit-learn's Lloyd from the same start agrees)
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(2)
    means = 50.0 * rng.normal(size=(6, 5))
    centers = [means[rng.choice(6, 3, replace=False)] + 0.1 * rng.normal(size=(3, 5))
               for _ in range(30)]
    C = np.concatenate(centers)
    start = np.arange(3, 6)
    a = farthest_first(C, 6, start=start)
    b = farthest_first(C, 6, start=start, x_sq=(C * C).sum(axis=1))
    np.testing.assert_array_equal(a, b)
    assert a.tolist() == _farthest_first_reference(C, 6, start)
    agg = aggregate_centers(centers, 6, first_device=1)
    km = KMeans(6, init=C[a], n_init=1, max_iter=1, algorithm="lloyd").fit(C)
    order = [int(np.argmin(((km.cluster_centers_ - c) ** 2).sum(axis=1))) for c in agg.centers]
    np.testing.assert_allclose(agg.centers, km.cluster_centers_[order], rtol=1e-10)
    labels = np.concatenate(agg.center_labels)
    np.testing.assert_array_equal(np.asarray(order)[labels], km.predict(C))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_check_devices_many_small_devices_name_the_non_finite_one(bad):
    # several stacked chunks of small devices: the one with NaN / inf is named, and a
    # federation where every chunk is finite comes back as given
    rng = np.random.default_rng(1)
    devs = [rng.normal(size=(20, 20)) for _ in range(1200)]
    assert all(a is b for a, b in zip(check_devices(devs), devs))
    devs[1000] = devs[1000].copy()
    devs[1000][4, 2] = bad
    with pytest.raises(ValidationError, match=r"device 1000 contains a non-finite value"):
        check_devices(devs)


def test_check_devices_large_device_after_small_ones_is_tested():
    # small devices all finite (the stacked check clears them) and one large device with
    # inf: the large one is still read and named
    rng = np.random.default_rng(2)
    devs = [rng.normal(size=(10, 5)) for _ in range(50)] + [rng.normal(size=(2000, 5))]
    devs[-1][1500, 3] = -np.inf
    with pytest.raises(ValidationError, match=r"device 50 contains a non-finite value"):
        check_devices(devs)
