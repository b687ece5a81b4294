"""k-FED's ``server="kmeans++"``: k-means++ restarts on the device centers instead of
the paper's farthest-first start, checked against scikit-learn's KMeans."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from fedclust import KFed, ValidationError
from fedclust.kfed.server import aggregate_centers


def _devices_with_one_outlying_center(seed=0):
    """4 unit clusters on a square of side 10 (d = 5); 20 devices hold two clusters each;
    device 0 also holds 5 points 15 away from everything (its second local center)."""
    rng = np.random.default_rng(seed)
    means = np.zeros((4, 5))
    means[:, :2] = [[0, 0], [10, 0], [0, 10], [10, 10]]
    devices, labels = [], []
    for z in range(20):
        pair = [z % 4, (z + 1 + z // 4) % 4]
        if pair[0] == pair[1]:
            pair[1] = (pair[1] + 1) % 4
        y = np.repeat(pair, 50)
        X = means[y] + 0.5 * rng.normal(size=(100, 5))
        if z == 0:  # one true cluster only, plus a far-away handful
            y = np.full(100, pair[0])
            X = means[y] + 0.5 * rng.normal(size=(100, 5))
            far = np.array([[5.0, -15.0, 0, 0, 0]]) + 0.5 * rng.normal(size=(5, 5))
            X, y = np.vstack([X, far]), np.concatenate([y, np.full(5, -1)])
        devices.append(X)
        labels.append(y)
    return devices, labels


def test_kmeanspp_server_ignores_an_outlying_center_farthest_first_takes():
    devices, labels = _devices_with_one_outlying_center()
    y = np.concatenate(labels)
    inlier = y >= 0
    paper = KFed(4, 2, server="farthest-lloyd1", random_state=0).fit(devices)
    ours = KFed(4, 2, server="kmeans++", random_state=0).fit(devices)
    ari = lambda m: adjusted_rand_score(y[inlier], np.concatenate(m.device_labels_)[inlier])
    assert ari(ours) == 1.0
    assert ari(paper) < 0.9  # farthest-first spends a final center on the 5 far points


def test_kmeanspp_server_reaches_sklearn_kmeans_inertia_on_the_centers():
    rng = np.random.default_rng(3)
    centers = [rng.normal(size=(rng.integers(1, 4), 6)) + 4 * rng.integers(0, 5, size=(1, 6))
               for _ in range(40)]
    C = np.concatenate(centers)
    agg = aggregate_centers(centers, 5, method="kmeans++", rng=np.random.default_rng(0))
    ours = ((C - agg.centers[np.concatenate(agg.center_labels)]) ** 2).sum()
    ref = KMeans(5, n_init=10, random_state=0).fit(C).inertia_
    assert ours <= ref * (1 + 1e-6)
    # every device center carries the label of its nearest final center
    d = ((C[:, None] - agg.centers[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(np.concatenate(agg.center_labels), d.argmin(1))


def test_kmeanspp_server_is_reproducible_and_needs_the_server_stream():
    devices, _ = _devices_with_one_outlying_center(1)
    a = KFed(4, 2, server="kmeans++", random_state=5).fit(devices)
    b = KFed(4, 2, server="kmeans++", random_state=5).fit(devices)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    with pytest.raises(ValidationError, match="rng"):
        aggregate_centers([np.eye(3)], 2, method="kmeans++")


def test_kmeanspp_server_is_the_same_on_flower():
    from fedclust.flower import FlowerInMemoryTransport
    devices, _ = _devices_with_one_outlying_center(2)
    a = KFed(4, 2, server="kmeans++", random_state=1).fit(devices)
    b = KFed(4, 2, server="kmeans++", random_state=1).fit(
        devices, transport=FlowerInMemoryTransport())
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
