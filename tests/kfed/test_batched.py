"""The vectorised many-devices path must give each device what it gets alone."""

import numpy as np
import pytest

from fedclust import KFed
from fedclust.core.random import device_rng, device_uniforms
from fedclust.kfed.batched import (_SUBSPACE_PROBE, _cross, _labels_kept, _subspace_batch,
                                   kmeanspp_batch, lloyd_batch, n_uniforms, projection_batch,
                                   top_eigvecs)
from fedclust.kfed.local import local_kmeans, local_kmeans_many


def _devices(n_dev, n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    means = 4.0 * rng.normal(size=(3 * k, d))
    out = []
    for _ in range(n_dev):
        comps = rng.choice(len(means), size=k, replace=False)
        X = np.concatenate([means[c] + rng.normal(size=(n // k, d)) for c in comps])
        out.append(X[rng.permutation(len(X))])
    return out


@pytest.mark.parametrize("n,d,k,n_dev", [(20, 50, 2, 25), (60, 8, 3, 25), (30, 3, 5, 25),
                                         (20, 20, 2, 150), (15, 40, 3, 100)])
def test_batch_equals_one_by_one(n, d, k, n_dev):
    # 100+ devices take the batched subspace-iteration projection, one device takes eigh
    devs = _devices(n_dev, n, d, k)
    single = [local_kmeans(X, k, device_rng(3, z)) for z, X in enumerate(devs)]
    many = local_kmeans_many(devs, k, [device_rng(3, z) for z in range(len(devs))],
                             max_batch_elements=max(5, n_dev // 2) * n * max(d, k))  # 2+ chunks
    for a, b in zip(single, many):
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_allclose(a.message.centers, b.message.centers, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(a.message.counts, b.message.counts)


def test_kfed_local_centers_equal_standalone_device_steps():
    devs = _devices(40, 24, 30, 3, seed=1) + _devices(5, 33, 30, 3, seed=2)  # two shapes
    m = KFed(9, 3, server="farthest-lloyd1", random_state=11).fit(devs)
    for z, X in enumerate(devs):
        ref = local_kmeans(X, 3, device_rng(11, z, 0),
                           uniforms=device_uniforms(11, [z], 0, n_uniforms(3))[0])
        np.testing.assert_allclose(m.local_centers_[z], ref.message.centers, rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("n,d,k", [(20, 20, 2), (30, 12, 3), (10, 40, 2), (25, 16, 4)])
def test_subspace_projection_spans_top_singular_subspace(n, d, k):
    rng = np.random.default_rng(n + d)
    B = 200
    means = 3.0 * rng.normal(size=(B, k + 1, d))
    X = means[:, rng.integers(0, k + 1, n)] + rng.normal(size=(B, n, d))
    X[0] = 0.0                       # rank 0: goes to the eigh fallback, no NaN
    X[1, :, 1:] = 0.0                # rank 1
    V = projection_batch(X, k)
    assert V.shape == (B, d, k) and np.isfinite(V).all()
    for b in range(2, B):
        Vt = np.linalg.svd(X[b], full_matrices=False)[2][:k].T
        np.testing.assert_allclose(V[b] @ V[b].T, Vt @ Vt.T, atol=1e-6)
        np.testing.assert_allclose(V[b].T @ V[b], np.eye(k), atol=1e-10)
    # the rank-1 device: projected distances equal those on the one informative axis
    P = X[1] @ V[1]
    np.testing.assert_allclose(np.linalg.norm(P, axis=1), np.abs(X[1, :, 0]), atol=1e-9)


def test_wide_subspace_projection_on_every_path_spans_top_subspace():
    # k = 10 of d = 64 (Householder bases): separated clusters converge in the plain
    # sweeps, pure noise (a small eigengap) needs the squared sweeps or the eigh fallback
    rng = np.random.default_rng(5)
    B, n, d, k = 12, 300, 64, 10
    means = 20.0 * rng.normal(size=(B, k, d))
    X = means[:, rng.integers(0, k, n)] + rng.normal(size=(B, n, d))
    X[6:] = rng.normal(size=(6, n, d)) * np.linspace(3.0, 1.0, d)
    G = X.transpose(0, 2, 1) @ X
    _, ok_plain = _subspace_batch(G, k, power_sweeps=0)
    assert ok_plain[:6].all() and not ok_plain[6:].any()
    V = projection_batch(X, k)
    for b in range(B):
        Vt = np.linalg.svd(X[b], full_matrices=False)[2][:k].T
        np.testing.assert_allclose(V[b] @ V[b].T, Vt @ Vt.T, atol=1e-6)
        np.testing.assert_allclose(V[b].T @ V[b], np.eye(k), atol=1e-10)


def _grams(B, groups, n=20, d=20, seed=0):
    """Grams (B, d, d) of B devices of n points in ``groups`` separated groups."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(B, n, d))
    for g in range(groups):
        X[:, g::groups] += 100.0 * rng.normal(size=(B, 1, d))
    return X.transpose(0, 2, 1) @ X


def _iteration_then_eigh(G, k):
    """The subspace iteration over the whole batch, eigh where it has not converged."""
    Q, ok = _subspace_batch(G, k)
    Q[~ok] = np.linalg.eigh(G[~ok])[1][:, :, ::-1][:, :, :k]
    return Q, ok


def test_top_eigvecs_when_the_probe_fails_equals_eigh_bit_for_bit():
    # k = 4 on devices of 2 groups: the iteration converges on none of them, and the
    # whole batch gets LAPACK's basis, exactly as the iteration's fallback gives it
    G = _grams(3 * _SUBSPACE_PROBE, groups=2)
    ref, ok = _iteration_then_eigh(G, 4)
    assert not ok.any()
    Q = top_eigvecs(G, 4)
    np.testing.assert_array_equal(Q, np.linalg.eigh(G)[1][:, :, ::-1][:, :, :4])
    np.testing.assert_array_equal(Q, ref)


def test_top_eigvecs_after_a_converging_probe_equals_the_whole_batch_iteration():
    # devices of 4 groups at k = 4 converge; noise devices (no eigengap) after the probe fall
    # back to eigh: splitting the batch at the probe changes no device's bits
    G = np.concatenate([_grams(2 * _SUBSPACE_PROBE, groups=4, seed=1),
                        _grams(40, groups=1, seed=2)])
    ref, ok = _iteration_then_eigh(G, 4)
    assert ok[:_SUBSPACE_PROBE].any() and not ok.all()
    Q = top_eigvecs(G, 4)
    np.testing.assert_array_equal(Q, ref)
    # and each basis spans the top-4 eigenspace
    W = np.linalg.eigh(G)[1][:, :, ::-1][:, :, :4]
    np.testing.assert_allclose(Q @ Q.transpose(0, 2, 1), W @ W.transpose(0, 2, 1), atol=1e-6)


def test_projection_matches_svd_both_shapes():
    rng = np.random.default_rng(0)
    for n, d in [(40, 10), (10, 40)]:
        X = rng.normal(size=(3, n, d))
        V = projection_batch(X, 3)
        for b in range(3):
            _, _, Vt = np.linalg.svd(X[b], full_matrices=False)
            # same subspace: the projectors agree
            np.testing.assert_allclose(V[b] @ V[b].T, Vt[:3].T @ Vt[:3], atol=1e-8)


def test_kmeanspp_batch_distinct_and_follows_uniforms():
    rng = np.random.default_rng(0)
    P = rng.normal(size=(4, 30, 2))
    U = rng.random((4, n_uniforms(5)))
    idx = kmeanspp_batch(P, 5, U)
    assert all(len(set(row)) == 5 for row in idx.tolist())
    # first center: inverse CDF of a uniform over n rows
    np.testing.assert_array_equal(idx[:, 0], np.floor(U[:, 0] * 30).astype(int))
    # duplicated points: still k distinct rows
    Q = np.repeat(P[:, :3], 10, axis=1)
    idx = kmeanspp_batch(Q, 5, U)
    assert all(len(set(row)) == 5 for row in idx.tolist())


@pytest.mark.parametrize("k", [1, 2, 6])
def test_kmeanspp_batch_nearest_seeds_match_distances_to_the_seeds(k):
    # the two nearest seeds tracked during the seeding, against the distances to the
    # returned seeds computed afresh (ties: a point duplicated onto a seed has distance 0)
    rng = np.random.default_rng(k)
    P = np.repeat(rng.normal(size=(5, 20, 3)), 2, axis=1)
    U = rng.random((5, n_uniforms(k)))
    idx, near, d1, d2 = kmeanspp_batch(P, k, U, nearest=True)
    np.testing.assert_array_equal(idx, kmeanspp_batch(P, k, U))   # the same seeds
    for b in range(5):
        D = ((P[b][:, None, :] - P[b][idx[b]][None]) ** 2).sum(axis=2)     # (n, k)
        S = np.sort(D, axis=1)
        np.testing.assert_allclose(d1[b], S[:, 0], atol=1e-12)
        np.testing.assert_allclose(d2[b], S[:, 1] if k > 1 else np.inf, atol=1e-12)
        clear = S[:, 1] - S[:, 0] > 1e-9 if k > 1 else np.ones(len(D), dtype=bool)
        np.testing.assert_array_equal(near[b][clear], D.argmin(axis=1)[clear])


def test_overlapping_clusters_do_not_collapse_to_singletons():
    # c = 5: means 5σ apart while points lie ~10σ from their mean (d = 100). The
    # ⅓-filter keeps only a few points per seed here; those θ_r must not pin
    # near-singleton clusters (regression: k-FED fell to ~11% accuracy at c = 5).
    from fedclust.datasets import make_federated_gaussians
    from fedclust.metrics import matched_accuracy

    fd = make_federated_gaussians(n_features=100, n_clusters=16, m0=5, separation=5.0,
                                  n_per_component=200, random_state=0)
    m = KFed(16, 4, server="farthest-lloyd1", random_state=0).fit(fd.devices)
    counts = np.concatenate(m.local_counts_)
    assert counts.min() >= 4          # an average local cluster has 40 points
    assert matched_accuracy(fd.y, m.labels_) > 0.75


@pytest.mark.parametrize("max_iter, tol", [(300, 1e-4), (300, 0.0), (1, 0.0), (2, 1e9)])
def test_lloyd_batch_labels_are_nearest_to_the_returned_centers(max_iter, tol):
    # labels kept from the last assignment (centers unmoved) or assigned again (centers moved)
    rng = np.random.default_rng(7)
    X = rng.normal(size=(6, 40, 3)) + rng.integers(0, 3, size=(6, 40, 1)) * 4.0
    init = X[:, :4].copy()
    C, L, N, it = lloyd_batch(X, init, max_iter=max_iter, tol=tol)
    for b in range(6):
        np.testing.assert_array_equal(L[b], _cross(X[b:b + 1], C[b:b + 1])[0].argmin(axis=1))
        np.testing.assert_array_equal(N[b], np.bincount(L[b], minlength=4))


@pytest.mark.parametrize("spread", [0.05, 1.5])
@pytest.mark.parametrize("g,d,dtype", [(3, 2, np.float64), (6, 2, np.float64),
                                       (6, 64, np.float64), (6, 64, np.float32)])
def test_lloyd_batch_stopped_by_the_shift_rule_returns_the_nearest_labels(spread, g, d, dtype):
    # a large tol stops every device after one update: labels kept by the bound (separated
    # groups, d x k large enough for lloyd_batch to use it) or assigned again (overlapping
    # ones) are the nearest centers' all the same
    rng = np.random.default_rng(3)
    X = spread * rng.normal(size=(8, 60, d))
    X[:, :, 0] += (np.arange(60) % g) * 2.0
    X = X.astype(dtype)
    init = X[:, :g] + 0.01   # one point of each group
    kept = _labels_kept(_cross(X, init), _cross(X, init).argmin(axis=2),
                        np.einsum("bnd,bnd->bn", X, X), np.full((8, g), 1e-4), init, init + 0.01)
    assert kept.all() if spread < 1 else not kept.all()
    C, L, N, it = lloyd_batch(X, init, max_iter=50, tol=1e6)
    assert (it == 1).all()
    for b in range(8):
        np.testing.assert_array_equal(L[b], _cross(X[b:b + 1], C[b:b + 1])[0].argmin(axis=1))
        np.testing.assert_array_equal(N[b], np.bincount(L[b], minlength=g))


def test_kmeanspp_batch_leaves_its_input_alone_in_one_dimension():
    rng = np.random.default_rng(8)
    P = rng.normal(size=(3, 30, 1))
    before = P.copy()
    kmeanspp_batch(P, 4, rng.random((3, n_uniforms(4))))
    np.testing.assert_array_equal(P, before)


@pytest.mark.parametrize("chunk_devices", [2, 30])
def test_large_devices_non_finite_one_gets_its_own_error_and_the_others_their_steps(
        chunk_devices):
    # large devices are tested for finite values where each stacked chunk is copied (one
    # chunk, or several through the reused buffer); the protocol then runs the group one by
    # one: the bad device gets its own error, the others the same step as alone
    from fedclust.core.exceptions import ValidationError
    from fedclust.core.protocol import Request
    from fedclust.kfed import local as local_mod
    from fedclust.kfed.protocol import ACTION, KFedProtocol

    devs = _devices(6, 600, 10, 3, seed=4)   # 6,000 values each: stacked in chunks
    devs[4] = devs[4].copy()
    devs[4][17, 2] = np.inf
    proto = KFedProtocol(5, 3)
    states = {z: {} for z in range(6)}
    old = local_mod.LARGE_BATCH_ELEMENTS
    local_mod.LARGE_BATCH_ELEMENTS = chunk_devices * 6000
    try:
        batches, out = proto.client_steps_stacked(Request(round=0, action=ACTION),
                                                  dict(enumerate(devs)), seed=2, states=states)
    finally:
        local_mod.LARGE_BATCH_ELEMENTS = old
    assert batches == [] and isinstance(out[4], ValidationError) and "device 4" in str(out[4])
    for z in (0, 1, 2, 3, 5):
        ref = local_kmeans(devs[z], 3, device_rng(2, z, 0),
                           uniforms=device_uniforms(2, [z], 0, n_uniforms(3))[0])
        np.testing.assert_allclose(out[z].centers, ref.message.centers, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d,bad", [(20, np.nan), (20, -np.inf), (2, np.nan)])
def test_tiny_devices_non_finite_one_gets_its_own_error_and_the_others_their_steps(d, bad):
    # tiny devices are stacked into one array; with a Gram matrix to compute (d > k' and
    # n >= d) its diagonal tests the copy for finite values, else a separate pass does:
    # either way the bad device gets its own error and the others the same step as alone
    from fedclust.core.exceptions import ValidationError
    from fedclust.core.protocol import Request
    from fedclust.kfed.protocol import ACTION, KFedProtocol

    devs = _devices(40, 20, d, 2, seed=5)
    devs[7] = devs[7].copy()
    devs[7][3, 1] = bad
    proto = KFedProtocol(4, 2)
    states = {z: {} for z in range(40)}
    batches, out = proto.client_steps_stacked(Request(round=0, action=ACTION),
                                              dict(enumerate(devs)), seed=3, states=states)
    assert batches == [] and isinstance(out[7], ValidationError) and "device 7" in str(out[7])
    assert "non-finite" in str(out[7])
    for z in (0, 6, 8, 39):
        ref = local_kmeans(devs[z], 2, device_rng(3, z, 0),
                           uniforms=device_uniforms(3, [z], 0, n_uniforms(2))[0])
        np.testing.assert_array_equal(out[z].centers, ref.message.centers)
        np.testing.assert_array_equal(states[z]["local_labels"], ref.labels)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 7])
def test_nearest_center_helpers_match_argmin_and_bincount(k):
    from fedclust.kfed.batched import _argmin_last, _counts

    rng = np.random.default_rng(k)
    D = rng.integers(0, 3, size=(6, 50, k)).astype(float)   # many ties: the first one wins
    D[0, :5] = np.inf
    idx = _argmin_last(D)
    np.testing.assert_array_equal(idx, D.argmin(axis=2))
    assert idx.dtype == np.int64
    labels = np.where(rng.random((6, 50)) < 0.2, k, idx)     # label k: not counted
    np.testing.assert_array_equal(
        _counts(labels, k), [np.bincount(row[row < k], minlength=k) for row in labels])
