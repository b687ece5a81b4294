"""Distributed Lloyd's sample start (``init="sample"``, round 0): each device sends
``points_per_device`` of its own rows drawn without replacement from its own stream, and
its size."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.core.protocol import Request
from fedclust.core.random import device_rng
from fedclust.lloyd.protocol import DistributedLloydProtocol


def _reply(p, X, device_id, seed=7, round_index=0):
    return p.client_step(Request(round_index, "sample"), X, device_id=device_id, seed=seed,
                         state={})


@pytest.mark.parametrize("n, m", [(50, 10), (6, 10)])
def test_a_device_sends_m_distinct_rows_of_its_own_and_its_size(n, m):
    X = np.arange(n * 3, dtype=np.float64).reshape(n, 3)   # every row distinct
    p = DistributedLloydProtocol(2, points_per_device=m, n_features=3)
    r = _reply(p, X, device_id=4)
    take = min(n, m)
    assert r.points.shape == (take, 3) and int(r.n_points) == n
    assert r.n_points.dtype == np.int64
    rows = [tuple(x) for x in r.points]
    assert len(set(rows)) == take                       # without replacement
    assert set(rows) <= {tuple(x) for x in X}           # the device's own rows
    # exactly the rows its own stream picks (seed, device id, round), a copy of them
    idx = device_rng(7, 4, 0).choice(n, size=take, replace=False)
    np.testing.assert_array_equal(r.points, X[idx])
    assert not np.shares_memory(r.points, X)


def test_the_draw_is_the_devices_own_and_reproducible():
    X = np.random.default_rng(0).normal(size=(200, 2))
    p = DistributedLloydProtocol(2, points_per_device=15, n_features=2)
    a, again = _reply(p, X, 1), _reply(p, X, 1)
    np.testing.assert_array_equal(a.points, again.points)
    assert not np.array_equal(a.points, _reply(p, X, 2).points)            # another device
    assert not np.array_equal(a.points, _reply(p, X, 1, seed=8).points)    # another seed
    assert not np.array_equal(a.points, _reply(p, X, 1, round_index=1).points)  # another round


def test_the_server_seeds_by_kmeans_plusplus_over_the_samples_weighted_by_device_size():
    from fedclust.core.kmeans import kmeans_plusplus
    from fedclust.core.random import server_rng
    from fedclust.lloyd.messages import PointSample

    rng = np.random.default_rng(5)
    samples = {0: rng.normal(size=(4, 2)), 1: rng.normal(size=(1, 2)) + 3.0,   # one point
               2: rng.normal(size=(3, 2)) - 3.0}
    sizes = {0: 1000, 1: 40, 2: 30}
    pts = np.concatenate([samples[z] for z in (0, 1, 2)])
    w = np.concatenate([np.full(len(samples[z]), sizes[z] / len(samples[z])) for z in (0, 1, 2)])
    for seed in range(4):
        p = DistributedLloydProtocol(3)
        state = p.start([0, 1, 2], seed=seed)
        req = p.next_request(state)
        p.server_step(state, req, {z: PointSample(points=samples[z], n_points=np.asarray(sizes[z]))
                                   for z in (0, 1, 2)})
        want = pts[kmeans_plusplus(pts, 3, server_rng(seed), weights=w)]
        np.testing.assert_array_equal(state.centers, want)
