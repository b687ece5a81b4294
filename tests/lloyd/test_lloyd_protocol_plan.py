"""What a distributed-Lloyd fit declares and checks: its releases (one per round kind,
with the documented weights), its config round trip and the replies it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.core.exceptions import IncompatibleMessageError
from fedclust.core.protocol import Request
from fedclust.lloyd.messages import CandidateBroadcast, CenterBroadcast, ClusterSums, Moments
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy
from fedclust.privacy import kmeans as pk

DP = DifferentialPrivacy(1.0, 1e-6, data_bound=3.0)


@pytest.mark.parametrize("init", ["candidates"])
@pytest.mark.parametrize("T", [1, 2, 5])
def test_releases_weigh_the_candidates_and_the_last_round_T_plus_1(init, T):
    d, k = 6, 4
    p = DistributedLloydProtocol(k, init=init, max_rounds=T, privacy=DP, n_features=d)
    rels = p.releases()
    B = 3.0
    expect = [(pk.MOMENTS, 2 * B * B, 1, 1.0),
              (pk.CANDIDATES, B * math.sqrt(1 + 1 / k), 1, T + 1.0)]
    if T > 1:   # the middle rounds, and the first Lloyd round's spread (its trust radius)
        expect.append((pk.LLOYD, B * math.sqrt(1 + 1 / d), T - 1, 1.0))
        expect.append((pk.SPREAD, B, 1, pk.SPREAD_SHARE))
    expect.append((pk.FINAL, B * math.sqrt(1 + 1 / d), 1, T + 1.0))
    got = [(r.what, r.sensitivity, r.repeats, r.share) for r in rels]
    assert got == [(w, pytest.approx(s, rel=1e-12), n, sh) for w, s, n, sh in expect]
    # each round uses its own release: the init's two, then T - 1 middle rounds and the last
    first = 2 if init == "candidates" else 1
    if init == "candidates":
        assert p._release(0, "moments") is p.plan.releases[0]
        assert p._release(1, "candidates") is p.plan.releases[1]
    lloyd = [p._release(first + t, "lloyd") for t in range(T)]
    assert lloyd[-1] is p.plan.releases[-1]
    assert all(r is p.plan.releases[2] for r in lloyd[:-1])


def test_rounds_are_numbered_from_zero_and_candidates_follow_moments():
    p = DistributedLloydProtocol(2, init="candidates", privacy=DP, n_features=3)
    state = p.start([3, 5], seed=1)
    assert state.device_ids == (3, 5)
    req = p.next_request(state)
    assert (req.round, req.action) == (0, "moments")
    rng = np.random.default_rng(0)
    replies = {z: p.client_step(req, rng.normal(size=(30, 3)), device_id=z, seed=1, state={})
               for z in (3, 5)}
    p.server_step(state, req, replies)
    req = p.next_request(state)
    assert (req.round, req.action) == (1, "candidates")
    assert req.payload is state.candidates


def test_config_round_trip_keeps_the_plan_and_the_noise_devices():
    p = DistributedLloydProtocol(3, init="candidates", max_rounds=4, privacy=DP, n_features=5,
                                 noise_devices=4)
    q = DistributedLloydProtocol.from_config(p.config())
    assert q.config() == p.config()
    assert q.noise_devices == 4 and q.n_clusters == 3
    assert [r.noise_multiplier for r in q.plan.releases] == \
        [r.noise_multiplier for r in p.plan.releases]


def test_replies_of_the_wrong_shape_are_refused_by_name():
    p = DistributedLloydProtocol(2, init="candidates", privacy=DP, n_features=3)
    state = p.start([0], seed=0)
    with pytest.raises(IncompatibleMessageError, match=r"device 7: moments have 4 features, "
                                                       r"expected 3"):
        p.check_reply(state, Request(0, "moments"), 7,
                      Moments(n=np.asarray(1.0), s=np.zeros(4), Q=np.zeros((4, 4))))
    state.candidates = CandidateBroadcast(mean=np.zeros(3), basis=np.eye(3)[:, :2],
                                          coords=np.zeros((5, 2)))
    bad = ClusterSums(sums=np.zeros((4, 2)), counts=np.zeros(4), cost=np.asarray(0.0))
    with pytest.raises(IncompatibleMessageError, match=r"device 2: candidate sums have shape "
                                                       r"\(4, 2\)"):
        p.check_reply(state, Request(1, "candidates", state.candidates), 2, bad)
    state.centers = np.zeros((2, 3))
    with pytest.raises(IncompatibleMessageError, match=r"device 9: sums have shape \(4, 2\), "
                                                       r"expected \(2, 3\)"):
        p.check_reply(state, Request(2, "lloyd", CenterBroadcast(state.centers)), 9, bad)
    # right shapes pass
    p.check_reply(state, Request(2, "lloyd", CenterBroadcast(state.centers)), 9,
                  ClusterSums(sums=np.zeros((2, 3)), counts=np.zeros(2), cost=np.asarray(0.0)))


def test_devices_get_their_labels_from_the_final_centers():
    p = DistributedLloydProtocol(2)
    X = np.array([[0.0, 0.0], [10.0, 0.0], [1.0, 0.0]])
    out = p.client_finish(CenterBroadcast(np.array([[9.0, 0.0], [0.5, 0.0]])), X, {})
    np.testing.assert_array_equal(out["labels"], [1, 0, 1])
    assert p.client_finish(None, X, {}) == {}
