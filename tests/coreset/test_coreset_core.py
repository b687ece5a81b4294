"""Distributed PCA and the distributed coreset: properties against independent references."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA

from fedclust import DistributedKMeans, DistributedPCA
from fedclust.coreset.local import (balcan_budget, coreset_portion, local_solution,
                                    top_right_singular)
from fedclust.coreset.server import combine_spectra, solve_weighted_kmeans
from fedclust.coreset.messages import LocalSpectrum
from fedclust.sim.partition import weighted_partition


def _cost(X, C, w=None):
    d = ((X[:, None, :] - C[None]) ** 2).sum(-1).min(1)
    return float(d.sum() if w is None else d @ w)


@pytest.fixture(scope="module")
def mixture():
    rng = np.random.default_rng(1)
    means = 4.0 * rng.standard_normal((6, 8))
    X = np.concatenate([m + rng.standard_normal((500, 8)) for m in means])
    parts = weighted_partition(len(X), 8, random_state=3)
    return X, [X[p] for p in parts]


@pytest.mark.parametrize("method", ["coreset", "combine"])
def test_coreset_cost_within_eps_for_random_centers(mixture, method):
    # epsilon = 0.1 for a coreset of size t = 500 (N = 3000, d = 8, k = 6, 8 nodes);
    # measured max error over these 100 center sets is about 0.03
    X, devices = mixture
    rng = np.random.default_rng(7)
    for seed in range(5):
        km = DistributedKMeans(6, 500, method=method, random_state=seed).fit(devices)
        P, w = km.coreset_
        assert len(P) <= 500 + 8 * (1 + 6)   # t + rounding + the local centers
        for _ in range(20):
            C = 4.0 * rng.standard_normal((6, 8))
            assert abs(_cost(P, C, w) / _cost(X, C) - 1) <= 0.1


def test_signed_weights_add_up_to_n_and_sampled_weights_are_unbiased(mixture):
    X, devices = mixture
    km = DistributedKMeans(6, 300, random_state=0).fit(devices)
    assert km.coreset_[1].sum() == pytest.approx(len(X), rel=1e-9)
    # E[sum of the sampled weights of one node] = t_i * sum_c / (t c_i) ~= n_i
    Z = devices[0]
    centers, labels, costs = local_solution(Z, 6, np.random.default_rng(0))
    total = 5.0 * costs.sum()  # pretend the other nodes hold 4x this node's cost
    t_i, ratio = balcan_budget(costs.sum(), len(Z), total, 5 * len(Z), 300)
    sums = []
    for s in range(200):
        part = coreset_portion(Z, centers, labels, costs, t_i, ratio, np.random.default_rng(s))
        sums.append(part.weights[:t_i].sum())
        assert part.weights.sum() == pytest.approx(len(Z))
    expected = t_i * total / (300 * costs.sum()) * len(Z)   # exact expectation
    assert np.mean(sums) == pytest.approx(expected, rel=0.05)
    assert expected == pytest.approx(len(Z), rel=0.02)


def test_small_node_sends_all_points_and_zero_cost_is_uniform():
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((5, 3))
    c, lab, m = local_solution(Z, 2, rng)
    part = coreset_portion(Z, c, lab, m, 10, 0.5, rng)
    assert np.array_equal(part.points, Z) and np.all(part.weights == 1)
    # every cost 0 -> uniform budgets t_i = ceil(t n_i / N) and ratio N / (t n_i)
    assert balcan_budget(0.0, 30, 0.0, 100, 10) == (3, 100 / (10 * 30))
    dup = np.repeat(rng.standard_normal((2, 3)), 20, axis=0)   # 2 distinct points, k = 2
    c, lab, m = local_solution(dup, 2, rng)
    assert m.sum() == 0
    part = coreset_portion(dup, c, lab, m, 4, 40 / 4 / 40, rng)
    assert part.weights.sum() == pytest.approx(40)
    assert _cost(part.points, c, part.weights) == pytest.approx(0.0, abs=1e-9)


def test_pca_of_one_node_equals_sklearn():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((300, 12)) @ rng.standard_normal((12, 12))
    p = DistributedPCA(4, local_components=12, random_state=0).fit([X])
    sk = PCA(4).fit(X)
    np.testing.assert_allclose(np.abs(p.components_ @ sk.components_.T), np.eye(4), atol=1e-8)
    np.testing.assert_allclose(p.explained_variance_, sk.explained_variance_, rtol=1e-10)
    np.testing.assert_allclose(p.mean_, X.mean(0), atol=1e-12)
    assert np.all(np.diff(p.explained_variance_) <= 0)   # sorted descending


def test_dispca_with_t_at_least_rank_is_exact_and_sorted_descending():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((600, 5)) @ rng.standard_normal((5, 40))   # rank 5
    X += rng.standard_normal(40)
    devices = np.array_split(X, 6)
    p = DistributedPCA(5, local_components=6, random_state=0).fit(devices)
    sk = PCA(5).fit(X)
    np.testing.assert_allclose(np.abs(p.components_ @ sk.components_.T), np.eye(5), atol=1e-8)
    np.testing.assert_allclose(p.explained_variance_, sk.explained_variance_, rtol=1e-9)
    np.testing.assert_allclose(p.inverse_transform(p.transform(X)), X, atol=1e-8)
    # the global step keeps the LARGEST directions even when fed in another order
    spectra = [LocalSpectrum(np.array([1.0, 3.0][::-1]), np.eye(3)[[1, 0]]),
               LocalSpectrum(np.array([2.0]), np.eye(3)[[2]])]
    V, s = combine_spectra(spectra, 2)
    np.testing.assert_allclose(s, [3.0, 2.0])
    np.testing.assert_allclose(np.abs(V), np.eye(3)[[1, 2]])


def test_n_components_at_least_d_is_identity():
    rng = np.random.default_rng(4)
    devices = [rng.standard_normal((40, 6)) for _ in range(3)]
    p = DistributedPCA(50, random_state=0).fit(devices)
    assert p.components_.shape == (6, 6)
    np.testing.assert_allclose(p.components_.T @ p.components_, np.eye(6), atol=1e-10)
    a = DistributedKMeans(3, 60, n_components=6, random_state=0).fit(devices)
    b = DistributedKMeans(3, 60, random_state=0).fit(devices)
    assert a.components_ is None
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


def test_randomized_svd_close_to_exact():
    rng = np.random.default_rng(5)
    # a decaying spectrum, as real data have (rank-15 signal plus noise)
    A = (rng.standard_normal((800, 15)) * np.geomspace(50, 5, 15)) @ rng.standard_normal((15, 300))
    A += rng.standard_normal((800, 300))
    s, V = top_right_singular(A, 10, np.random.default_rng(0))   # randomized path
    s_ex = np.linalg.svd(A, compute_uv=False)[:10]
    np.testing.assert_allclose(s, s_ex, rtol=1e-3)


def test_pca_then_coreset_close_to_pooled_kmeans():
    rng = np.random.default_rng(6)
    U = np.linalg.qr(rng.standard_normal((60, 5)))[0]
    mu = 6.0 * rng.standard_normal((5, 5))
    y = rng.integers(0, 5, 2000)
    X = (mu[y] + rng.standard_normal((2000, 5))) @ U.T + 0.3 * rng.standard_normal((2000, 60))
    devices = np.array_split(X, 7)
    ref = KMeans(5, n_init=5, random_state=0).fit(X).inertia_
    km = DistributedKMeans(5, 400, n_components=8, random_state=0).fit(devices)
    assert km.cluster_centers_.shape == (5, 60)          # lifted to the original space
    assert _cost(X, km.cluster_centers_) <= 1.05 * ref
    np.testing.assert_array_equal(np.concatenate(km.device_labels_), km.predict(X))


def test_solver_clips_negative_weights():
    rng = np.random.default_rng(8)
    P = np.concatenate([rng.standard_normal((50, 2)), rng.standard_normal((50, 2)) + 10,
                        [[100.0, 100.0]]])
    w = np.concatenate([np.ones(100), [-5.0]])   # a negative center weight far away
    C, cost = solve_weighted_kmeans(P, w, 2, seed=0)
    assert np.all(np.abs(C).max(axis=1) < 20)          # the negative point attracts no center
    assert cost == pytest.approx(_cost(P[:100], C))


def test_node_order_invariance_and_same_seed(mixture):
    _, devices = mixture
    ids = [10, 11, 12, 13, 14, 15, 16, 17]
    a = DistributedKMeans(6, 300, n_components=4, random_state=3).fit(devices, device_ids=ids)
    perm = np.random.default_rng(0).permutation(len(devices))
    b = DistributedKMeans(6, 300, n_components=4, random_state=3).fit(
        [devices[i] for i in perm], device_ids=[ids[i] for i in perm])
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.coreset_[1], b.coreset_[1])
    for i, p in enumerate(perm):
        np.testing.assert_array_equal(b.device_labels_[i], a.device_labels_[p])
    c = DistributedKMeans(6, 300, n_components=4, random_state=3).fit(devices, device_ids=ids)
    np.testing.assert_array_equal(a.cluster_centers_, c.cluster_centers_)


def test_star_bytes_equal_formula(mixture):
    _, devices = mixture
    k, t, tc, d = 6, 300, 4, 8
    km = DistributedKMeans(k, t, n_components=tc, local_components=5, random_state=0).fit(devices)
    owner = km.coreset_owner_
    up = 0
    for z, X in enumerate(devices):
        s_z = int((owner == z).sum())
        up += 8 * (d + 1) + 8 * min(5, len(X), d) * (d + 1) + 16 + 8 * s_z * (tc + 1) + 8
    n = len(devices)
    down = n * (8 * d + 8 * tc * d + 32 + 8 * k * d)
    comm = km.communication_
    assert comm["bytes_up"] == up and comm["bytes_down"] == down
    assert comm["words_total"] * 8 == up + down
    assert comm["rounds"] == 4


def test_empty_node_and_tiny_node(mixture):
    _, devices = mixture
    d = devices[0].shape[1]
    devs = [devices[0], np.zeros((0, d)), devices[1][:3], devices[2]]
    km = DistributedKMeans(6, 200, n_components=4, random_state=0).fit(devs)
    assert km.device_labels_[1].shape == (0,)
    assert not np.any(km.coreset_owner_ == 1)
    tiny = km.coreset_owner_ == 2
    assert tiny.sum() == 3 and np.all(km.coreset_[1][tiny] == 1.0)
    assert km.coreset_[1].sum() == pytest.approx(sum(len(X) for X in devs))
