"""Distributed Lloyd's own update, checked by hand and against scikit-learn's Lloyd.

The protocol is driven round by round through its public steps, so the start
centers are ours: the seeding round is answered with exactly the k start points
(k-means++ over k distinct points takes all of them).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedclust.core.protocol import Request
from fedclust.lloyd.messages import CenterBroadcast, PointSample
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy


def run_rounds(devices, start, T, *, tol=0.0):
    """Centers after T Lloyd rounds from ``start``, plus the start as the server ordered it."""
    proto = DistributedLloydProtocol(len(start), max_rounds=T, tol=tol)
    state = proto.start(list(range(len(devices))), seed=0)
    seed_req = proto.next_request(state)
    assert seed_req.action == "sample"
    proto.server_step(state, seed_req, {0: PointSample(points=np.asarray(start, float),
                                                       n_points=np.asarray(len(start)))})
    first = None
    while (req := proto.next_request(state)) is not None:
        if first is None:
            first = req.payload.centers.copy()
        replies = {z: proto.client_step(req, X, device_id=z, seed=0, state={})
                   for z, X in enumerate(devices)}
        proto.server_step(state, req, replies)
    return proto.finish(state, None), first


def test_one_round_by_hand_moves_singletons_and_keeps_an_empty_center():
    dev0 = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    dev1 = np.array([[9.0, 0.0], [5.0, 5.0]])
    start = np.array([[0.0, 0.0], [10.0, 0.0], [5.0, 6.0], [100.0, 100.0]])
    res, first = run_rounds([dev0, dev1], start, 1)
    # (0,0), (2,0), (0,2) -> first center; (9,0) alone -> second; (5,5) alone -> third;
    # nothing is nearest to (100, 100), which stays where it is
    by_hand = {(0.0, 0.0): (2 / 3, 2 / 3), (10.0, 0.0): (9.0, 0.0), (5.0, 6.0): (5.0, 5.0),
               (100.0, 100.0): (100.0, 100.0)}
    assert sorted(map(tuple, first)) == sorted(by_hand)
    expect = np.array([by_hand[tuple(c)] for c in first])
    assert np.allclose(res.centers, expect, rtol=0, atol=1e-15)
    # the cost of the start centers, by hand: 0 + 4 + 4 + 1 + 1
    assert res.cost_history == [pytest.approx(10.0, abs=1e-12)]


def overlapping_with_singleton(seed):
    """Three overlapping Gaussian blobs (centers 1.5 apart, unit noise) and one far point."""
    rng = np.random.default_rng(seed)
    means = np.array([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [0.0, 1.5, 0.0]])
    X = np.concatenate([means[i] + rng.standard_normal((40, 3)) for i in range(3)])
    X = np.concatenate([X, [[30.0, 30.0, 30.0]]])
    X = X[rng.permutation(len(X))]
    start = np.concatenate([X[rng.choice(np.flatnonzero(X[:, 0] < 20), 3, replace=False)],
                            [[28.0, 29.0, 31.0]]])    # near the far point, not on it
    return X, start


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("T", [1, 2, 5, 20])
def test_T_rounds_equal_scikit_learn_lloyd(seed, T):
    X, start = overlapping_with_singleton(seed)
    devices = np.array_split(X, [17, 60, 61, 100])       # one device holds a single point
    res, first = run_rounds(devices, start, T)
    ref = KMeans(4, init=first, n_init=1, max_iter=T, tol=0.0, algorithm="lloyd").fit(X)
    # the far point is a cluster on its own throughout
    assert np.sum(ref.labels_ == ref.labels_[np.argmax(X[:, 0])]) == 1
    assert np.bincount(ref.labels_, minlength=4).min() >= 1   # no empty cluster to relocate
    assert np.allclose(res.centers, ref.cluster_centers_, rtol=0, atol=1e-10)


def test_cost_history_is_the_pooled_cost_of_each_broadcast():
    X, start = overlapping_with_singleton(4)
    devices = np.array_split(X, 3)
    costs = []
    C = None
    for T in range(1, 5):
        res, first = run_rounds(devices, start, T)
        C = first if C is None else C
        D = ((X[:, None, :] - C[None]) ** 2).sum(-1)
        costs.append(D.min(axis=1).sum())
        C = KMeans(4, init=first, n_init=1, max_iter=T, tol=0.0,
                   algorithm="lloyd").fit(X).cluster_centers_
        assert res.cost_history == pytest.approx(costs, rel=1e-12)


def test_stops_when_the_cost_no_longer_improves():
    X, start = overlapping_with_singleton(5)
    res, first = run_rounds(np.array_split(X, 2), start, 200, tol=1e-3)
    assert res.converged and len(res.cost_history) < 200
    c = res.cost_history
    assert c[-2] - c[-1] <= 1e-3 * c[-2]
    assert all(a - b > 1e-3 * a for a, b in zip(c[:-2], c[1:-1]))


@pytest.mark.parametrize("unit", ["point", "device"])
def test_private_lloyd_reply_sums_the_clipped_rows(unit):
    """ε = ∞ and a bound that clips most rows: the released sums and counts are those of
    the clipped rows, each clipped row assigned to its nearest center."""
    rng = np.random.default_rng(0)
    d, bound = 3, 1.0
    X = 3.0 * rng.standard_normal((50, d))
    norms = np.linalg.norm(X, axis=1)
    assert (norms > bound).mean() > 0.8
    Xc = np.where(norms[:, None] > bound, X * (bound / norms)[:, None], X)
    C = np.array([[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.5, 0.0]])
    labels = ((Xc[:, None, :] - C[None]) ** 2).sum(-1).argmin(axis=1)
    dp = DifferentialPrivacy(math.inf, 1e-6, unit=unit, data_bound=bound,
                             clip_norm=1e6 if unit == "device" else None)
    proto = DistributedLloydProtocol(3, init="candidates", privacy=dp, n_features=d)
    state = {}
    reply = proto.client_step(Request(2, "lloyd", CenterBroadcast(C)), X, device_id=0, seed=0,
                              state=state)
    for j in range(3):
        assert np.allclose(reply.sums[j], Xc[labels == j].sum(axis=0), rtol=0, atol=1e-12)
        assert reply.counts[j] == np.sum(labels == j)
    assert int(state["n_clipped"]) == int((norms > bound).sum())
