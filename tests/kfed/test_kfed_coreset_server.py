"""The default server's starts on a keyed coreset (many device centers): the weighted cost it
reaches against scikit-learn's weighted k-means and the all-centers step, on both final
Lloyd kernels, and float32 device centers staying float32."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedclust.kfed import keyed
from fedclust.kfed.server import aggregate_centers


def _pieces(rng, n_dev, k, d, dtype=np.float64):
    means = rng.uniform(-6, 6, size=(k, d))
    centers, counts = [], []
    for _ in range(n_dev):
        kz = int(rng.integers(1, 5))
        centers.append((means[rng.integers(k, size=kz)] + 1.5 * rng.normal(size=(kz, d)))
                       .astype(dtype))
        counts.append(rng.integers(1, 30, size=kz))
    return centers, counts


def _cost(C, w, centers):
    return float(w @ ((C[:, None] - centers[None]) ** 2).sum(-1).min(1))


@pytest.mark.parametrize("blocked", [False, True])
def test_coreset_step_costs_what_the_all_centers_step_costs(monkeypatch, blocked):
    rng = np.random.default_rng(21 + blocked)
    k, d = 8, 5
    centers, counts = _pieces(rng, 1500, k, d)
    C, w = np.concatenate(centers), np.concatenate(counts).astype(float)
    full = aggregate_centers(centers, k, counts=counts, method="weighted-kmeans++", seed=3)
    monkeypatch.setattr(keyed, "SAMPLED_ABOVE", 0)
    monkeypatch.setattr(keyed, "SAMPLE_MIN", 400)
    monkeypatch.setattr(keyed, "SAMPLE_PER_CLUSTER", 1)
    monkeypatch.setattr(keyed, "LARGE_N", 0 if blocked else 10**9)
    assert keyed.sample_size(len(C), k) == 400 and len(C) > 800
    got = aggregate_centers(centers, k, counts=counts, method="weighted-kmeans++", seed=3)
    ref = KMeans(k, n_init=10, random_state=0).fit(C, sample_weight=w)
    cost = _cost(C, w, got.centers)
    assert cost <= 1.01 * _cost(C, w, full.centers)
    assert cost <= 1.01 * _cost(C, w, ref.cluster_centers_)
    # every device center's label is its nearest final center
    labels = np.concatenate(got.center_labels)
    assert np.array_equal(labels, ((C[:, None] - got.centers[None]) ** 2).sum(-1).argmin(1))


def test_float32_centers_stay_float32_on_the_blocked_kernel(monkeypatch):
    rng = np.random.default_rng(4)
    centers, counts = _pieces(rng, 600, 4, 3, np.float32)
    monkeypatch.setattr(keyed, "SAMPLED_ABOVE", 0)
    monkeypatch.setattr(keyed, "SAMPLE_MIN", 200)
    monkeypatch.setattr(keyed, "LARGE_N", 0)
    got = aggregate_centers(centers, 4, counts=counts, method="weighted-kmeans++", seed=1)
    assert got.centers.dtype == np.float32 and np.isfinite(got.centers).all()


def test_coreset_draws_in_key_blocks_are_the_whole_draw(monkeypatch):
    # each center's keyed uniform is its own hash: drawn in row blocks (a partial last one)
    # the coreset keeps the same centers with the same weights as in one pass
    from fedclust.kfed import keyed as kd
    rng = np.random.default_rng(8)
    C = rng.normal(size=(5003, 3)) * rng.uniform(0.1, 5, size=(5003, 1))
    w = rng.integers(1, 9, 5003).astype(float)
    c_sq = np.einsum("ij,ij->i", C, C)
    owner = np.repeat(np.arange(1700) * 11 + 2, 3)[:5003]
    local_index = np.tile(np.arange(3), 1700)[:5003]
    whole = kd.keyed_coreset(C, w, c_sq, owner, local_index, 5, 600)
    monkeypatch.setattr(kd, "_KEY_BLOCK", 1000)
    rows, ws = kd.keyed_coreset(C, w, c_sq, owner, local_index, 5, 600)
    assert np.array_equal(rows, whole[0]) and np.array_equal(ws, whole[1])
    assert 400 < len(rows) < 800 and np.all(np.diff(rows) > 0)   # about m, each row once
    # the weights are unbiased: they add up to the total weight within sampling error
    assert abs(ws.sum() - w.sum()) < 0.15 * w.sum()
