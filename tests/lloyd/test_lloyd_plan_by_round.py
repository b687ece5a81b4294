"""What each distributed-Lloyd round releases and declares, and the private start's
choice, written out from their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.core.protocol import Request, RunLog
from fedclust.lloyd.messages import PointSample
from fedclust.lloyd.protocol import DistributedLloydProtocol, private_start
from fedclust.privacy import DifferentialPrivacy
from fedclust.privacy import kmeans as pk

DP = DifferentialPrivacy(1.0, 1e-6, data_bound=3.0)


@pytest.mark.parametrize("T", [1, 2, 4])
def test_each_round_releases_its_own_release_and_the_first_lloyd_round_the_spread(T):
    p = DistributedLloydProtocol(3, init="candidates", privacy=DP, n_features=5, max_rounds=T)
    rel = {r.what: r for r in p.plan.releases}
    got = [p.round_releases(Request(0, "moments")), p.round_releases(Request(1, "candidates"))]
    assert got == [[p.plan.releases[0]], [rel[pk.CANDIDATES]]]
    lloyd = [p.round_releases(Request(2 + t, "lloyd")) for t in range(T)]
    want = [[rel[pk.FINAL] if t == T - 1 else rel[pk.LLOYD]] for t in range(T)]
    if T > 1:
        want[0].append(rel[pk.SPREAD])
    assert lloyd == want
    # a non-private run and the raw-point sample release nothing to the ledger
    plain = DistributedLloydProtocol(3, max_rounds=T)
    assert plain.round_releases(Request(0, "sample")) == []
    assert plain.round_releases(Request(1, "lloyd")) == []


def test_a_box_start_declares_one_candidate_round_and_its_lloyd_rounds():
    box = DistributedLloydProtocol(3, init="box", privacy=DP, n_features=5, max_rounds=2)
    assert box.declared_rounds() == {"candidates": 1, "lloyd": 2}
    cand = DistributedLloydProtocol(3, init="candidates", privacy=DP, n_features=5, max_rounds=4)
    assert cand.declared_rounds() == {"moments": 1, "candidates": 1, "lloyd": 4}
    assert DistributedLloydProtocol(3, max_rounds=5).declared_rounds() == {"sample": 1, "lloyd": 5}
    assert DistributedLloydProtocol(3, init="kfed", max_rounds=6).declared_rounds() == \
        {"kfed": 1, "lloyd": 6}
    given = DistributedLloydProtocol(2, init=np.zeros((2, 3)), max_rounds=3)
    assert given.declared_rounds() == {"lloyd": 3}


def test_the_result_counts_rounds_and_candidates():
    p = DistributedLloydProtocol(2, max_rounds=2, tol=0.0)
    state = p.start([0], seed=0)
    req = p.next_request(state)
    p.server_step(state, req, {0: PointSample(points=np.array([[0.0, 0.0], [4.0, 0.0]]),
                                              n_points=np.asarray(2))})
    X = np.array([[0.0, 0.0], [1.0, 0.0], [4.0, 0.0]])
    while (req := p.next_request(state)) is not None:
        p.server_step(state, req, {0: p.client_step(req, X, device_id=0, seed=0, state={})})
    log = RunLog()
    res = p.finish(state, log)
    assert res.n_rounds == 3 and res.n_candidates == 0 and res.log is log
    np.testing.assert_allclose(np.sort(res.centers[:, 0]), [0.5, 4.0])
    box = DistributedLloydProtocol(3, init="box", privacy=DP, n_features=5)
    state = box.start([0], seed=0)
    assert box.finish(state, log).n_candidates == len(state.candidates.coords) == \
        pk.BOX_CANDIDATES * 3


def test_the_private_start_picks_the_box_below_4_d_to_the_1_5_z_points():
    d, k = 4, 2
    z = DistributedLloydProtocol(k, init="candidates", max_rounds=3, privacy=DP,
                                 n_features=d).plan.releases[0].noise_multiplier
    edge = 4.0 * d ** 1.5 * z
    assert private_start(math.floor(edge), k, d, DP) == ("box", 2)
    assert private_start(math.ceil(edge) if math.ceil(edge) > edge else edge + 1, k, d, DP) == \
        ("candidates", 3)
    assert private_start(10 ** 9, d, d, DP) == ("box", 2)          # k >= d
    assert private_start(10 ** 9, d + 1, d, DP) == ("box", 2)
    assert private_start(10, k, d, DifferentialPrivacy(math.inf, 1e-6, data_bound=3.0)) == \
        ("candidates", 3)
