"""``n_local_clusters="auto"`` in batches must choose what each device chooses alone."""

import numpy as np
import pytest

from fedclust import KFed
from fedclust.core.exceptions import ValidationError
from fedclust.core.random import device_rng
from fedclust.kfed.local import local_kmeans
from fedclust.kfed.local_auto import (auto_range, kmeans_bic, local_kmeans_auto,
                                      local_kmeans_auto_many)


def _uneven_devices(n_dev, n, d, seed):
    """Devices holding 2-16 blobs of varied spread: BIC picks different k_z across them."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_dev):
        g = int(rng.integers(2, 17))
        means = rng.normal(size=(g, d)) * rng.uniform(2.0, 8.0)
        out.append(means[rng.integers(0, g, n)] + rng.normal(size=(n, d)))
    return out


@pytest.mark.parametrize("n,d,k,n_dev", [(90, 5, 4, 70), (90, 30, 4, 70), (60, 30, 6, 20),
                                         (90, 30, 10, 70)])
def test_batched_auto_chooses_the_reference_k_and_centers(n, d, k, n_dev):
    # 64+ devices take the batched subspace projection; the reference runs each device alone
    devs = _uneven_devices(n_dev, n, d, seed=n + d + k)
    ref = [local_kmeans_auto(X, k, device_rng(7, z)) for z, X in enumerate(devs)]
    got = local_kmeans_auto_many(devs, k, lambda i: device_rng(7, i),
                                 max_batch_elements=(n_dev // 3) * n * 2 * k)   # 3+ chunks
    chosen = [len(r.message.centers) for r in ref]
    assert len(set(chosen)) >= 3      # the case exercises the choice, not one constant k_z
    assert [len(r.message.centers) for r in got] == chosen
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_allclose(a.message.centers, b.message.centers, rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(a.message.counts, b.message.counts)


def test_chosen_k_has_the_highest_bic_over_the_range():
    # independent of both code paths' bookkeeping: rerun every k_z and score it by hand
    devs = _uneven_devices(8, 90, 6, seed=3)
    got = local_kmeans_auto_many(devs, 5, lambda i: device_rng(1, i))
    for z, X in enumerate(devs):
        rng = device_rng(1, z)
        scores = {}
        for kz in range(*np.add(auto_range(len(X), 5), (0, 1))):
            r = local_kmeans(X, kz, rng)
            dist = ((X[:, None, :] - r.message.centers[None]) ** 2).sum(axis=2)
            inertia = dist[np.arange(len(X)), r.labels].sum()
            scores[kz] = kmeans_bic(len(X), X.shape[1], np.bincount(r.labels, minlength=kz),
                                    inertia)
        assert len(got[z].message.centers) == max(scores, key=lambda kz: (scores[kz], -kz))


def test_few_distinct_points_stop_the_search_as_the_reference():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(12, 4)) * 5
    devs = [base[rng.integers(0, 12, 90)] for _ in range(3)]   # 12 distinct points, k_z up to 18
    ref = [local_kmeans_auto(X, 10, device_rng(2, z)) for z, X in enumerate(devs)]
    got = local_kmeans_auto_many(devs, 10, lambda i: device_rng(2, i))
    for a, b in zip(ref, got):
        assert len(a.message.centers) == len(b.message.centers) <= 12
        np.testing.assert_allclose(a.message.centers, b.message.centers, rtol=1e-10)
    tiny = [base[rng.integers(0, 3, 90)] for _ in range(2)]    # 3 distinct points < lo = 10
    with pytest.raises(ValidationError, match="device 0 has only 3 distinct points"):
        local_kmeans_auto_many(tiny, 10, lambda i: device_rng(2, i))


def test_kfed_auto_fit_equals_per_device_reference():
    devs = _uneven_devices(70, 90, 8, seed=5) + _uneven_devices(3, 60, 8, seed=6)  # two shapes
    # "auto" picks k_z by BIC for the servers that use k_z as sent (the default server's
    # devices send its summary, min(n_z // 5, 2k) centers)
    m = KFed(6, "auto", server="kmeans++", random_state=4).fit(devs)
    for z, X in enumerate(devs):
        ref = local_kmeans_auto(X, 6, device_rng(4, z, 0))
        np.testing.assert_allclose(m.local_centers_[z], ref.message.centers, rtol=1e-10,
                                   atol=1e-10)
