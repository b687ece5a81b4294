"""The default server's per-device summary: each device refines its local k-means (2k, 4k, ...
up to a byte cap) until its local clusters' scatter is at most a quarter of its own.

References: scikit-learn's KMeans(n_init=10) on the pooled rows, scikit-learn's KMeans on
one device for the scatter a 2k summary hides, and the same device run alone (the
one-device path) against the batched path.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

import fedclust.kfed.local as local
import fedclust.kfed.summary as summary
from fedclust import KFed
from fedclust.kfed.summary import summary_cap, summary_ladder


def _cost(X, C):
    return float(((X[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum())


def _elongated_federation(seed, k=3, d=8, sites=8):
    """k overlapping groups, each stretched 3x along a random direction; 8 sites of 60-200
    rows in Dirichlet shares of the groups, each site shifted a little."""
    rng = np.random.default_rng(seed)
    means = 1.5 * rng.normal(size=(k, d))
    shapes = [np.diag(np.r_[3.0, np.ones(d - 1)]) @ np.linalg.qr(rng.normal(size=(d, d)))[0]
              for _ in range(k)]
    devices = []
    for _ in range(sites):
        n = int(rng.integers(60, 200))
        g = rng.choice(k, size=n, p=rng.dirichlet(np.ones(k)))
        shift = 0.3 * rng.normal(size=d)
        devices.append(np.stack([means[j] + rng.normal(size=d) @ shapes[j] for j in g]) + shift)
    return devices


def test_the_refined_summary_reaches_the_pooled_basin_where_2k_centers_do_not(monkeypatch):
    coarse, fine = [], []
    for seed in range(6):
        devices = _elongated_federation(seed)
        X = np.concatenate(devices)
        ref = KMeans(3, n_init=10, random_state=0).fit(X)
        fine.append(_cost(X, KFed(3, random_state=0).fit(devices).cluster_centers_)
                    / ref.inertia_)
        with monkeypatch.context() as m:   # hidden share 1: every device stops at 2k
            m.setattr(summary, "SUMMARY_HIDDEN_SHARE", 1.0)
            coarse.append(_cost(X, KFed(3, random_state=0).fit(devices).cluster_centers_)
                          / ref.inertia_)
    # 2k centers per device: up to 1.4 % above pooled k-means (mean 0.7 %)
    assert max(coarse) > 1.01, coarse
    assert max(fine) <= 1.005 and np.mean(fine) < np.mean(coarse), (fine, coarse)


def test_a_device_refines_only_when_its_2k_clusters_hide_much_of_its_scatter():
    rng = np.random.default_rng(3)
    k, d = 3, 3
    # three tight, well separated groups: 2k local clusters hide almost nothing
    grouped = np.concatenate([c + 0.1 * rng.normal(size=(40, d))
                              for c in 20.0 * np.eye(d)])
    # one round blob: 2k = 6 clusters of a 3-d Gaussian keep well over a quarter of its scatter
    blob = rng.normal(size=(400, d))
    total = float(((blob - blob.mean(0)) ** 2).sum())
    assert KMeans(2 * k, n_init=10, random_state=0).fit(blob).inertia_ > 0.25 * total
    m = KFed(k, random_state=0).fit([grouped, blob])
    sent = [len(c) for c in m.local_centers_]
    assert sent[0] == 2 * k
    assert sent[1] > 2 * k and sent[1] in summary_ladder(400, d, k)
    # what the blob's device sent hides at most a quarter of its scatter (or is the cap)
    C = m.local_centers_[1]
    hidden = ((blob[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum()
    assert hidden <= 0.25 * total or sent[1] == summary_cap(400, d, k)
    assert np.array_equal(np.bincount(((blob[:, None, :] - C[None]) ** 2).sum(-1).argmin(1),
                                      minlength=len(C)), m.local_counts_[1])


def test_ladder_and_cap_by_hand():
    # 8 KiB of (d + 2) 8-byte centers: d = 100 -> 10, d = 13 -> 68; never above n // 5
    assert summary_cap(10**6, 100, 3) == 8192 // (102 * 8) == 10
    assert summary_cap(10**6, 13, 3) == 8192 // (15 * 8) == 68
    assert summary_cap(100, 13, 3) == 20
    assert summary_cap(10**6, 2000, 3) == 6          # never below 2k
    assert summary_ladder(1000, 13, 3) == [6, 12, 24, 48, 68]
    assert summary_ladder(100, 13, 3) == [6, 12, 20]
    assert summary_ladder(20, 13, 3) == [4]          # n // 5 below 2k: one rung
    assert summary_ladder(1000, 13, 3, start=50) == [50, 68]


def test_first_rung_by_hand():
    # 2k centers unless they take more than 8 KiB; then 8 KiB worth (never above n // 5)
    assert summary.summary_size(1000, 3) == summary.summary_size(1000, 3, 100) == 6
    assert summary.summary_size(1000, 50, 100) == 10 == 8192 // (102 * 8)
    assert summary.summary_size(1000, 50) == 100
    assert summary.summary_size(30, 50, 13) == 6
    assert summary_ladder(1000, 100, 50) == [10, 20, 40, 80, 100]


def test_many_final_clusters_few_per_device_send_8_kib_not_2k_centers():
    # 40 separated groups in 60-D, each device holding 4 of them: the first rung (8 KiB,
    # 16 centers) already hides almost nothing, so no device climbs to 2k = 80 centers,
    # and the answer is as good as pooled k-means'.
    rng = np.random.default_rng(5)
    k, d = 40, 60
    means = 20 * rng.normal(size=(k, d))
    devices, groups = [], []
    for z in range(30):
        g = rng.choice(k, size=4, replace=False)[rng.integers(0, 4, size=400)]
        devices.append(means[g] + rng.normal(size=(400, d)))
        groups.append(g)
    model = KFed(k, random_state=3).fit(devices)
    per_device = 8192 // ((d + 2) * 8)
    assert per_device == 16
    assert all(len(c) == per_device for c in model.local_centers_)
    X, g = np.vstack(devices), np.concatenate(groups)
    pooled = KMeans(k, n_init=10, random_state=0).fit(X)
    assert _cost(X, model.cluster_centers_) <= 1.01 * pooled.inertia_
    assert adjusted_rand_score(g, model.labels_) >= adjusted_rand_score(g, pooled.labels_) - 0.01


@pytest.mark.parametrize("n", [40, 150])
def test_batched_devices_send_what_each_sends_alone(n):
    rng = np.random.default_rng(n)
    devices = [rng.normal(size=(n, 4)) + rng.normal(scale=2, size=4) for _ in range(5)]
    together = KFed(3, random_state=11).fit(devices)
    for z, X in enumerate(devices):
        alone = KFed(3, random_state=11).fit([X], device_ids=[z])
        np.testing.assert_array_equal(alone.local_centers_[0], together.local_centers_[z])
        np.testing.assert_array_equal(alone.local_counts_[0], together.local_counts_[z])


def test_a_device_with_few_distinct_rows_keeps_its_last_feasible_rung(monkeypatch):
    rng = np.random.default_rng(0)
    distinct = rng.normal(size=(8, 3))            # 8 distinct rows, each 15 times
    devices = [distinct[rng.permutation(np.repeat(np.arange(8), 15))] for _ in range(2)]
    assert summary_ladder(120, 3, 3) == [6, 12, 24]
    monkeypatch.setattr(summary, "SUMMARY_HIDDEN_SHARE", 0.0)   # every device climbs the ladder
    for fed in (devices, devices[:1]):            # batched and alone
        m = KFed(3, random_state=0).fit(fed)
        for X, C, N in zip(fed, m.local_centers_, m.local_counts_):
            # 12 centers would need 12 distinct rows: the device sends its 6-center rung
            assert len(C) == 6 and N.sum() == len(X) and (N > 0).all()
            labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
            np.testing.assert_allclose(C, [X[labels == j].mean(0) for j in range(6)])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_stacked_scatters_add_the_same_terms_as_each_device_alone(monkeypatch, dtype):
    # the ladder's scatter about each device's mean, stacked in blocks, and its local
    # clusters' scatter: the per-device numpy sums bit for bit (they decide the rung)
    monkeypatch.setattr(summary, "_SCATTER_BLOCK", 7)   # several blocks and a partial one
    rng = np.random.default_rng(5)
    X = (rng.normal(size=(30, 20, 6)) * rng.uniform(0.1, 50, size=(30, 1, 1))
         + rng.normal(scale=40, size=(30, 1, 6))).astype(dtype)
    want = np.array([float(((x - x.mean(axis=0)) ** 2).sum()) for x in X])
    assert np.array_equal(summary._total_scatter(X), want)
    ref = np.stack([((x - x.mean(axis=0)).astype(np.float64) ** 2).sum() for x in X])
    np.testing.assert_allclose(summary._total_scatter(X), ref, rtol=1e-5)
    C = rng.normal(size=(30, 3, 6)).astype(dtype)
    lab = rng.integers(0, 3, size=(30, 20))
    one = np.stack([local.local_scatter(x, c, la) for x, c, la in zip(X, C, lab)])
    assert np.array_equal(local.local_scatter_stacked(X, C, lab), one)
    hand = np.array([[((x[la == j] - c[j]).astype(np.float64) ** 2).sum() for j in range(3)]
                     for x, c, la in zip(X, C, lab)])
    np.testing.assert_allclose(one, hand, rtol=1e-5)
